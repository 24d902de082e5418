"""Database to engine in one place (`scheduler.snapshot.translate`): one vocabulary for job types,
the core's names as the models', and the rows a pod is rendered from read once."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler.core.types import (
    CycleResult,
    DeviceShare,
    JobKind,
    JobRequest,
    Placement,
    Preemption,
    Resources,
    RunningJob,
    WaitCode,
    WaitReason,
)
from scheduler.models import Job
from scheduler.snapshot.rows import ROW_FIELDS
from scheduler.snapshot.translate import (
    core_job_id,
    decisions,
    job_pk,
    job_request,
    priority_classes,
    running_jobs,
)
from tenants.models import JobType, PriorityClass
from tests.daemon.conftest import Env


def test_the_engine_and_the_database_name_job_types_alike() -> None:
    """The engine's job kinds are the database's job types, value for value: no table
    bridges two spellings ("fine-tuning" was "fine_tuning" in the engine)."""
    assert {k.value for k in JobKind} == set(JobType.values)


@pytest.mark.django_db
def test_every_job_type_reaches_the_engine_as_its_own_kind(env: Env) -> None:
    job = env.submit(type="fine-tuning")
    row = Job.objects.filter(pk=job.pk).values(*ROW_FIELDS)[0]
    classes = {
        pc["id"]: pc
        for pc in PriorityClass.objects.values(
            "id", "name", "value", "may_preempt", "preemptible", "counts_against_quota"
        )
    }
    request = job_request(row, {job.tenant_id: "t"}, classes)
    assert request.kind is JobKind.FINE_TUNING


@pytest.mark.django_db
def test_priority_classes_keep_the_models_names(env: Env) -> None:
    rows = list(
        PriorityClass.objects.values(
            "name", "value", "may_preempt", "preemptible", "counts_against_quota"
        )
    )
    made = {pc.name: pc for pc in priority_classes(rows)}
    for row in rows:
        pc = made[row["name"]]
        assert (pc.may_preempt, pc.counts_against_quota) == (
            row["may_preempt"],
            row["counts_against_quota"],
        )
        assert pc.critical is (not row["preemptible"])


@pytest.mark.django_db
def test_allocating_reads_no_job_spec_again(env: Env) -> None:
    """A pod is rendered from the row the snapshot read (`POD_KEYS`): placing a job reads
    no job's spec whole."""
    daemon = env.daemon()
    env.run(daemon)  # no inference job runs: scaling (which reads specs) is skipped after it
    env.submit(simulation={"duration_s": 600}, image="registry.example/train:1")
    with CaptureQueriesContext(connection) as sent:
        env.run(daemon)
    # The whole column in a select list, not a key of it (`-> 'image'`, `JSON_EXTRACT(...)`).
    whole = re.compile(r'"scheduler_job"\."spec"(\s+AS\s+"spec")?\s*(FROM|,\s*")')
    spec_reads = [q["sql"] for q in sent.captured_queries if whole.search(q["sql"])]
    assert spec_reads == []
    pods = env.backend.list_pods()
    assert len(pods) == 1


def test_the_engine_reads_each_models_per_user_cap(env: Env) -> None:
    """Per-flavor per-user caps reach the engine as they are: a cap of 0 on one model is kept,
    and another model's cap is not taken for it (they were collapsed to one, the lowest, and
    a 0 dropped)."""
    from scheduler.snapshot.build import build_snapshot
    from tenants.models import Quota

    Quota.objects.filter(tenant=env.org.alpha, flavor=env.org.h100).update(user_limit_milli=0)
    Quota.objects.create(tenant=env.org.alpha, flavor=env.org.a100, guaranteed_milli=0,
                         limit_milli=0, user_limit_milli=2000)  # fmt: skip
    tenants = {t.name: t for t in build_snapshot(env.clock(), decayed={}).snapshot.tenants}
    assert tenants["team-alpha"].user_caps == {"H100-80GB": 0, "A100-40GB": 2000}


def test_the_engines_result_comes_back_in_primary_keys() -> None:
    """The daemon speaks of jobs by primary key only: `decisions` turns the engine's ids
    back, once, and says who preempted whom."""
    result = CycleResult(
        placements=(Placement(job_id="12", flavor="H100", assignments=(), victims=("7",)),),
        preemptions=(
            Preemption(
                job_id="7",
                preemptor="12",
                replicas=(0,),
                whole_job=True,
                reason="reclaim",
                work_lost_gpu_s=0.0,
            ),
        ),
        reservations=(),
        waiting=(WaitReason(job_id="30", code=WaitCode.QUOTA, message="over quota"),),
    )
    chosen = decisions(result)
    assert [(j, p.job_id) for j, p in chosen.placements] == [(12, "12")]
    assert [j for j, _ in chosen.preemptions] == [7]
    assert [(j, w.message) for j, w in chosen.waiting] == [(30, "over quota")]
    assert chosen.preemptor_of == {7: {12}}
    assert job_pk(core_job_id(12)) == 12


def test_a_running_job_made_of_the_same_objects_is_the_same_running_job() -> None:
    """`running_jobs` with `kept`: unchanged inputs (the same row, allocation and share
    objects, as the daemon's cache hands them out) give the same RunningJob, so the engine
    finds what runs unchanged by identity; any input that is another object (a new row
    version, a started pod, a new allocation) gives a new one, equal to a fresh build."""
    when = datetime(2026, 1, 1, tzinfo=UTC)
    job = JobRequest("7", "t", "normal", Resources(gpu_milli=2000))
    alloc = {"id": 1, "job_id": 7, "replica": 0, "node__name": "n1", "flavor": "H100",
             "elastic": False, "started_at": when}  # fmt: skip
    shares = {1: (DeviceShare(0, 1000, 0), DeviceShare(1, 1000, 0))}
    binding = {7: {"id": 7, "state": "binding"}}
    kept: dict[int, Any] = {}

    def build(allocs: list[dict[str, Any]], rows: dict[int, Any]) -> tuple[RunningJob, ...]:
        return running_jobs(allocs, shares, rows, {}, lambda _row: job, kept)

    [first] = build([alloc], binding)
    [again] = build([alloc], binding)
    assert again is first and first.started is False
    running = {7: {"id": 7, "state": "running"}}
    [started] = build([alloc], running)
    assert started is not first and started.started is True
    second = {**alloc, "id": 2, "replica": 1}
    shares[2] = (DeviceShare(2, 1000, 0),)
    [grown] = build([second, alloc], running)
    assert [a.replica for a in grown.assignments] == [0, 1]
    assert grown == running_jobs([alloc, second], shares, running, {}, lambda _row: job)[0]
    assert list(kept) == [7]
    assert not grown.leaving


@pytest.mark.parametrize(
    ("state", "leaving"),
    [("admitted", False), ("binding", False), ("running", False), ("preempted", True),
     ("queued", True), ("cancelled", True)],
)  # fmt: skip
def test_a_job_holding_devices_it_is_giving_back_is_leaving(state: str, leaving: bool) -> None:
    """Preempted, requeued or ended with its pods still stopping: it holds its devices, but
    its tenant no longer borrows them (`RunningJob.leaving`, read by reclaims)."""
    job = JobRequest("7", "t", "normal", Resources(gpu_milli=1000))
    alloc = {"id": 1, "job_id": 7, "replica": 0, "node__name": "n1", "flavor": "H100",
             "elastic": False, "started_at": datetime(2026, 1, 1, tzinfo=UTC)}  # fmt: skip
    rows = {7: {"id": 7, "state": state}}
    [held] = running_jobs([alloc], {1: (DeviceShare(0, 1000, 0),)}, rows, {}, lambda _r: job)
    assert held.leaving is leaving
