"""How the workload controller keeps pace with a burst found in one pass (issue 37): it queues
it highest priority class first, then oldest, so a high class is not left behind a burst of
low ones while each is submitted (scheduler/workloads/order.py), and it tells many changes at
once. The classes read from the database, and a burst through the controller:
tests/workloads/test_controller.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from scheduler.workloads.controller import SyncStats, WorkloadController
from scheduler.workloads.order import job_type, queue_order

Obj = dict[str, Any]


def obj(name: str, created: str, **labels: str) -> Obj:
    return {"metadata": {"name": name, "creationTimestamp": created, "labels": labels}}


def test_highest_value_first_then_oldest_then_by_name() -> None:
    items = [
        ("u1", obj("a", "2026-12-06T10:00:02Z", cls="low")),
        ("u2", obj("b", "2026-12-06T10:00:03Z", cls="high")),
        ("u3", obj("c", "2026-12-06T10:00:01Z", cls="low")),
        ("u4", obj("d", "2026-12-06T10:00:03Z", cls="high")),
        ("u5", obj("e", "2026-12-06T10:00:00Z", cls="normal")),
    ]
    values = {"low": 200, "normal": 500, "high": 800}
    order = queue_order(items, lambda o: values[o["metadata"]["labels"]["cls"]])
    assert order == ["u2", "u4", "u5", "u3", "u1"]


def test_the_job_type_is_the_label_else_training_for_several_pods_else_batch() -> None:
    assert job_type({"metadata": {"labels": {"gantry.io/job-type": "inference"}}}) == "inference"
    assert job_type({"metadata": {}, "spec": {"parallelism": 4}}) == "training"
    assert job_type({"metadata": {}, "spec": {"parallelism": 1}}) == "batch"
    assert job_type({"metadata": {}, "spec": {}}) == "batch"


class SlowCluster:
    """Events and annotations that each take a round trip: four must be in flight at once
    for any to be answered (one after the other, each waits out the barrier and fails)."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(4, timeout=5)
        self.annotated: list[str] = []

    def record_event(self, namespace: str, name: str, *args: Any) -> None:
        self.barrier.wait()

    def annotate(self, namespace: str, name: str, *args: Any) -> None:
        self.annotated.append(name)


def test_a_passs_changes_are_told_many_at_once() -> None:
    """A burst of jobs changing state is told over several threads, each change's event and
    annotation written (scheduler/workloads/controller.py, `_tell_all`)."""
    cluster = SlowCluster()
    controller = WorkloadController(cluster)  # type: ignore[arg-type]
    tells = [
        ([("ns", f"job-{i}", "batch/v1", "Job", f"uid-{i}")], "Admitted", "admitted", False, True)
        for i in range(8)
    ]
    stats = SyncStats()
    controller._tell_all(tells, stats)
    assert stats.events == 8
    assert sorted(cluster.annotated) == sorted(f"job-{i}" for i in range(8))


@pytest.mark.django_db
@pytest.mark.postgresql("index plans")
def test_an_objects_job_is_found_by_the_workload_uid_index() -> None:
    """The controller finds each object's job by its uid, at every pass (mirror.mirrored_job)
    and for every job it tells of: by an index, not by a scan of every job ever submitted."""
    from scheduler.models import Job
    from scheduler.workloads.mirror import mirrored_job
    from tests.plans import index_plan

    assert mirrored_job("uid-1") is None
    # Unordered: on the test's empty table the planner may walk another index for the order
    # and filter (a real table's statistics make the uid the selective part).
    one = Job.objects.filter(spec__workload__uid="uid-1").order_by().values("id")
    assert "job_workload_uid" in index_plan(one)
    many = Job.objects.filter(spec__workload__uid__in=["uid-1", "uid-2"]).order_by().values("id")
    assert "job_workload_uid" in index_plan(many)
