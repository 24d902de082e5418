"""Reconcile (`scheduler.daemon.reconcile`): the rows it hands the snapshot, the starts written
after the binds, the pods listed after its reads, allocations by row version, orphans and
vanished pods."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.expressions import RawSQL
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduler.daemon.cache import SnapshotCache
from scheduler.daemon.reconcile import active_allocations
from scheduler.daemon.snapshot import build_snapshot
from scheduler.models import Allocation, Job, JobEvent, Node
from tests.daemon.conftest import Env, assert_consistent


@pytest.mark.postgresql("job rows cached by row version (xmin)")
def test_reconcile_hands_the_snapshot_rows_and_writes_the_starts_after_the_binds(
    env: Env,
) -> None:
    """Reconcile reads the rows of the jobs holding allocations once and hands them on
    without reading them again; the rows of the jobs whose allocations ended are not handed
    on. A job seen started is written `running` after the cycle's binds (`write_starts`):
    the UPDATE returns its new version and the cache takes what it wrote, so the next
    snapshot reads no row whole either."""
    from scheduler.daemon.reconcile import write_starts

    keeps = env.submit(simulation={"duration_s": 600})
    ends = env.submit(simulation={"duration_s": 1})
    daemon = env.daemon()
    env.run(daemon)  # both placed and bound
    env.clock.advance(5)  # one started, the other started and ended
    with CaptureQueriesContext(connection) as sent, transaction.atomic():
        rec = daemon.reconcile()
        built = build_snapshot(
            env.clock(), decayed={}, cache=daemon.cache, active=rec.active, running_rows=rec.rows
        )
        assert write_starts(rec, daemon.lease, daemon.cache) == 1
        again = build_snapshot(env.clock(), decayed={}, cache=daemon.cache)
    whole_rows = [q["sql"] for q in sent.captured_queries if '"max_runtime_s"' in q["sql"]]
    assert whole_rows == []
    assert set(rec.rows) == {keeps.pk}
    assert [r.job.id for r in built.snapshot.running] == [str(keeps.pk)]
    assert built.jobs[str(keeps.pk)]["state"] == "binding"  # as read: written after the binds
    assert again.jobs[str(keeps.pk)]["state"] == "running"
    version = daemon.cache.rows[keeps.pk][0]
    row_version = RawSQL("xmin::text::bigint", ())
    current = Job.objects.annotate(v=row_version).values_list("v", flat=True).get(pk=keeps.pk)
    assert version == current
    keeps.refresh_from_db()
    ends.refresh_from_db()
    assert (keeps.state, ends.state) == ("running", "succeeded")


def test_reconcile_sees_the_pods_that_end_while_it_reads_the_database(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pods are listed after reconcile's reads: a pod that ends meanwhile is seen by
    this cycle, not the next, and its devices wait one cycle less."""
    import scheduler.daemon.reconcile as reconciling

    job = env.submit(simulation={"duration_s": 1})
    daemon = env.daemon()
    env.run(daemon)  # placed and bound
    read = reconciling.active_allocations

    def slow_read(cache: SnapshotCache) -> list[dict[str, Any]]:
        rows = read(cache)
        env.clock.advance(5)  # the pod starts and ends while the database is read
        return rows

    monkeypatch.setattr(reconciling, "active_allocations", slow_read)
    with transaction.atomic():
        rec = daemon.reconcile()
    job.refresh_from_db()
    assert job.state == "succeeded"
    assert rec.active == []


def test_a_cycle_binds_before_it_records_the_jobs_seen_started(env: Env) -> None:
    """The devices reconcile freed go to the next jobs first: binding -> running of the jobs
    seen started (nothing waits on it) is written after the cycle's binds."""
    first = env.submit(simulation={"duration_s": 600}, resources={"gpus": 8})
    daemon = env.daemon()
    env.run(daemon)  # placed and bound
    second = env.submit(simulation={"duration_s": 600}, resources={"gpus": 8})
    states: list[str] = []
    daemon.hooks = {"bound": lambda: states.append(Job.objects.get(pk=first.pk).state)}
    env.clock.advance(5)  # past the simulated start delay
    daemon.step()  # `first` seen running, `second` placed and bound
    assert states == ["binding"]
    assert Job.objects.get(pk=first.pk).state == "running"
    assert Job.objects.get(pk=second.pk).state == "binding"
    assert daemon.last is not None and daemon.last.reconciled == 1


@pytest.mark.postgresql("allocations cached by row version (xmin)")
def test_allocations_are_read_again_when_they_or_their_node_change(env: Env) -> None:
    """Reconcile keeps active allocations by row version (the allocation's and its node's):
    a write to either, by anyone, reads the row again; an ended one drops out."""
    job = env.submit(simulation={"duration_s": 600})
    daemon = env.daemon()
    env.run(daemon, seconds=1, cycles=2)
    [alloc] = active_allocations(daemon.cache)
    assert alloc["job_id"] == job.pk and alloc["node__ready"] is True
    assert active_allocations(daemon.cache)[0] is alloc  # unchanged: the cached row
    Allocation.objects.filter(pk=alloc["id"]).update(end_reason="scaled down")
    [again] = active_allocations(daemon.cache)
    assert again["end_reason"] == "scaled down"
    Node.objects.filter(name=alloc["node__name"]).update(ready=False)
    [third] = active_allocations(daemon.cache)
    assert third["node__ready"] is False
    Allocation.objects.filter(pk=alloc["id"]).update(ended_at=timezone.now())
    assert active_allocations(daemon.cache) == []
    assert daemon.cache.allocations == {}


def test_orphan_pod_is_deleted_and_vanished_pod_fails_over(env: Env) -> None:
    job = env.submit(simulation={"duration_s": 600})
    daemon = env.daemon()
    env.run(daemon, seconds=2, cycles=2)
    from scheduler.daemon.apply import pod_request
    from scheduler.daemon.rows import ROW_FIELDS

    row = Job.objects.filter(pk=job.pk).values(*ROW_FIELDS)[0]
    stray = pod_request({**row, "id": 999_999}, 0, "h100-0003", (7,))
    env.backend.create_pod(stray)
    env.backend.vanish_pod(f"gantry-{job.pk}-a0-r0")
    env.run(daemon)
    assert stray.name not in {p.name for p in env.backend.list_pods()}
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("binding", 1)  # node loss: requeued and placed at once
    assert "vanished" in JobEvent.objects.filter(job=job, kind="attempt_failed").get().message
    assert_consistent(env.backend)
