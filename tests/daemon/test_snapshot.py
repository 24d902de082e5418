"""The snapshot (`scheduler.snapshot.build`): its query count, cold and warm; what a quiet
cycle reads; the GPUs of stopping attempts held; the recent preemptions (displaced) read
incrementally.

Issue 17, point 10: a preempted job's quota is held, like its devices, until its pods are
gone; it is not handed to jobs admitted in the same cycle (a chaos run saw limits exceeded
while victims terminated)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler.backends.base import FailureReason
from scheduler.jobs.services import job_submit
from scheduler.models import Allocation, Job, JobEvent
from scheduler.snapshot.build import build_snapshot
from scheduler.snapshot.cache import SnapshotCache
from tenants.models import Quota
from tests.conftest import job_spec
from tests.daemon.conftest import Env, assert_consistent


def test_snapshot_query_count_does_not_grow_with_the_cluster(
    env: Env, django_assert_max_num_queries: Any
) -> None:
    for _ in range(3):
        env.submit(simulation={"duration_s": 600})
    daemon = env.daemon()
    env.run(daemon, cycles=2)
    for _ in range(20):
        env.submit(resources={"gpus": 8})
    cache = SnapshotCache()
    # Cold: everything, the inventory (nodes, devices) included: it is kept in the cache of
    # one leadership, not in the process; the clusters' labels with the organisation.
    with django_assert_max_num_queries(14):
        built = build_snapshot(env.clock(), decayed={}, cache=cache)
    assert len(built.snapshot.running) == 3
    assert len(built.snapshot.pending) == 20
    assert len(built.snapshot.nodes) == 4
    # Warm: versions only (inventory and organisation, jobs), no whole rows, device shares,
    # tenants or old preemptions read again.
    # (SQLite has no row versions: it reads the cold set again, but no more.)
    with django_assert_max_num_queries(6 if connection.vendor == "postgresql" else 14):
        again = build_snapshot(env.clock(), decayed={}, cache=cache)
    assert again.snapshot == built.snapshot
    env.submit(user="bob-bravo", resources={"gpus": 8})
    heads = build_snapshot(env.clock(), decayed={}, per_queue=5).snapshot.pending
    # the 5 oldest of alpha's 20 (one tenant, one class) and bravo's one
    assert sorted(j.tenant for j in heads) == ["team-alpha"] * 5 + ["team-bravo"]


@pytest.mark.postgresql("the row-version (xmin) cache of a quiet cycle")
def test_a_quiet_cycle_reads_little(env: Env) -> None:
    """A cycle where nothing changed re-reads no job row, allocation or device share it
    already holds: reconcile reads allocations and their jobs' versions at once, and hands
    both to the snapshot, and scaling is skipped without inference jobs."""
    for _ in range(3):
        env.submit(simulation={"duration_s": 600})
    for _ in range(5):
        env.submit(replicas=4, resources={"gpus": 8})  # 24 + 32 over quota 32: they wait
    daemon = env.daemon(sync_every_s=60)  # the inventory sync is not part of this count
    env.run(daemon, seconds=1, cycles=3)
    with CaptureQueriesContext(connection) as quiet:
        env.run(daemon)
    sql = [q["sql"] for q in quiet.captured_queries]
    assert len(sql) <= 8, "\n".join(sql)
    # the active allocations' versions with their jobs', in one read by reconcile, handed
    # to the snapshot; no other read of the jobs holding allocations
    assert sum(q.startswith("SELECT a.id, a.xmin") for q in sql) == 1
    assert not any(q.startswith('SELECT "scheduler_job"') and "EXISTS(" in q for q in sql)
    # no allocation row (none changed)
    assert not any(q.startswith('SELECT "scheduler_allocation"."id"') for q in sql)
    assert not any("scheduler_allocationdevice" in q and q.startswith("SELECT") for q in sql)
    assert not any('"scheduler_job"."spec" AS' in q for q in sql)  # scaling's read


def test_gpus_of_a_stopping_attempt_are_not_given_out(env: Env) -> None:
    """A failed gang's surviving pod keeps its GPUs until it is gone (docs/faults.md 17): the engine
    sees them held, so nothing is placed on them meanwhile and no placement conflicts."""
    job = env.submit(
        replicas=2,
        resources={"gpus": 8},
        retry={"limit": 1, "backoff_s": 0},
        simulation={"duration_s": 600},
    )
    fillers = [env.submit(resources={"gpus": 8}, simulation={"duration_s": 600}) for _ in range(2)]
    daemon = env.daemon()
    env.run(daemon, seconds=2, cycles=2)
    env.backend.fail_pod(f"gantry-{job.pk}-a0-r1", FailureReason.OOM_KILLED)
    waiting = env.submit(resources={"gpus": 8}, simulation={"duration_s": 600})
    env.run(daemon)
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("queued", 1)
    survivor = Allocation.objects.get(job=job, attempt=0, replica=0)
    assert survivor.ended_at is None  # its pod is still terminating
    waiting.refresh_from_db()
    assert waiting.state == "binding"  # took the failed replica's node, not the survivor's
    assert Allocation.objects.get(job=waiting).node_id != survivor.node_id
    assert all(Job.objects.get(pk=f.pk).state == "running" for f in fillers)
    assert_consistent(env.backend)
    env.run(daemon, seconds=3, cycles=2)
    survivor.refresh_from_db()
    assert survivor.ended_at is not None
    assert_consistent(env.backend)


def test_recent_preemptions_are_read_incrementally(env: Env) -> None:
    """The ping-pong guard's preemptions are read after the last event the cache holds:
    a new one is seen at the next snapshot, and one past the look-back is dropped; the
    preemptor -> victims map is rebuilt only when they change."""
    from datetime import timedelta

    from django.utils import timezone

    from scheduler.snapshot.build import DISPLACED_LOOKBACK_S, _displaced

    victim, preemptor, other = (env.submit() for _ in range(3))
    cache = SnapshotCache()
    assert _displaced(cache) == {}
    JobEvent.objects.create(job=victim, kind="preempted", data={"preemptor": preemptor.pk})
    assert _displaced(cache) == {preemptor.pk: (str(victim.pk),)}
    assert _displaced(cache) is _displaced(cache)  # nothing new: the same map, not rebuilt
    with CaptureQueriesContext(connection) as seen:
        JobEvent.objects.create(job=other, kind="preempted", data={"preemptor": preemptor.pk})
        found = _displaced(cache)
    assert found == {preemptor.pk: tuple(sorted((str(victim.pk), str(other.pk))))}
    assert "AND id > " in seen.captured_queries[-1]["sql"]
    old = timezone.now() - timedelta(seconds=DISPLACED_LOOKBACK_S + 60)
    cache.preemptions = [(i, old if v == str(victim.pk) else at, p, v)
                         for i, at, p, v in cache.preemptions]  # fmt: skip
    assert _displaced(cache) == {preemptor.pk: (str(other.pk),)}


def _gpus_of(tenant: str) -> int:
    held = Allocation.objects.filter(ended_at__isnull=True, job__tenant__slug=tenant)
    return sum(held.values_list("gpu_milli", flat=True)) // 1000


def test_a_victims_quota_is_held_until_its_pods_are_gone(env: Env) -> None:
    # team-bravo (guarantee 16, limit lowered to 24) runs 3 x 8 = 24 GPUs, borrowing 8;
    # team-charlie runs 4 GPUs on the last node, leaving 4 free there. bravo waits with a
    # 4-GPU job (24 + 4 > 24).
    Quota.objects.filter(tenant__slug="team-bravo").update(limit_milli=24_000)
    for _ in range(3):
        env.submit(user="bob-bravo", resources={"gpus": 8}, simulation={"duration_s": 10_000})
    spec = job_spec(replicas=1, resources={"gpus": 4}, simulation={"duration_s": 10_000})
    job_submit(user=env.org.users["chris"], project=env.org.proj_charlie, payload=spec)
    daemon = env.daemon()
    daemon.profile = type(daemon.profile)(min_runtime_s=0)
    env.run(daemon, seconds=2, cycles=2)
    assert _gpus_of("team-bravo") == 24
    small = env.submit(user="bob-bravo", resources={"gpus": 4}, simulation={"duration_s": 60})
    env.run(daemon, seconds=1)
    small.refresh_from_db()
    assert small.state == "queued" and small.reason.startswith("quota"), small.reason
    # team-alpha reclaims 8 of its guarantee: one of bravo's jobs is preempted. Until its pod
    # is gone, its 8 GPUs still count against bravo's limit: the small job must not start on
    # the 4 free GPUs meanwhile (24 + 4 of a limit of 24).
    mine = env.submit(resources={"gpus": 8}, simulation={"duration_s": 600})
    env.run(daemon)
    assert Job.objects.filter(tenant__slug="team-bravo", state="preempted").count() == 1
    small.refresh_from_db()
    assert small.state == "queued", small.reason
    (victim,) = Job.objects.filter(tenant__slug="team-bravo", state="preempted")
    # placed, but deferred: it preempted nobody itself, and says what it waits for
    assert small.reason == f"waiting for job(s) {victim.pk} to stop, preempted for other jobs"
    assert _gpus_of("team-bravo") <= 24
    env.run(daemon, seconds=1)  # the victim is still terminating (2 s grace)
    small.refresh_from_db()
    assert small.state == "queued", small.reason
    assert _gpus_of("team-bravo") <= 24
    env.run(daemon, seconds=3, cycles=2)  # gone: its quota and devices are free now
    mine.refresh_from_db()
    small.refresh_from_db()
    assert mine.state in ("binding", "running")
    assert small.state in ("binding", "running")
    assert _gpus_of("team-bravo") == 20
    assert_consistent(env.backend)
