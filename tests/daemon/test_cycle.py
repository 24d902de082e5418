"""One job's life through the daemon: placed, bound, running, finished; the snapshot's
query count; reasons; retries; max runtime; preemption; orphans."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import Model
from django.db.models.expressions import RawSQL
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduler.backends.base import FailureReason
from scheduler.daemon.cache import SnapshotCache
from scheduler.daemon.queue import _queue, queue_heads
from scheduler.daemon.reconcile import active_allocations
from scheduler.daemon.snapshot import build_snapshot
from scheduler.daemon.store import release
from scheduler.models import Allocation, AllocationDevice, GpuDevice, Job, JobEvent, Node
from tests.daemon.conftest import Env, assert_consistent


def _columns(row: Model) -> dict[str, Any]:
    """The row's column values but its key: to bulk-create copies of it."""
    meta = type(row)._meta
    return {f.attname: getattr(row, f.attname) for f in meta.concrete_fields if not f.primary_key}


def states(job: Job) -> list[str]:
    return list(JobEvent.objects.filter(job=job).values_list("to_state", flat=True))


def test_job_is_placed_bound_run_and_finished(env: Env) -> None:
    job = env.submit(replicas=2, resources={"gpus": 4}, simulation={"duration_s": 60})
    daemon = env.daemon()
    env.run(daemon)
    job.refresh_from_db()
    assert job.state == "binding"
    pods = {p.name: p for p in env.backend.list_pods()}
    assert set(pods) == {f"gantry-{job.pk}-a0-r0", f"gantry-{job.pk}-a0-r1"}
    assert all(p.node for p in pods.values())
    assert_consistent(env.backend)
    bound = Allocation.objects.filter(job=job).values_list("bound_at", flat=True)
    assert len(bound) == 2 and None not in bound
    env.run(daemon, seconds=2)
    job.refresh_from_db()
    assert job.state == "running"
    # 2 x 4 GPUs = 8 devices fully held
    assert sum(GpuDevice.objects.values_list("allocated_milli", flat=True)) == 8000
    env.run(daemon, seconds=60)
    job.refresh_from_db()
    assert job.state == "succeeded"
    assert states(job) == ["queued", "admitted", "binding", "running", "succeeded"]
    assert not Allocation.objects.filter(ended_at__isnull=True).exists()
    assert set(Allocation.objects.values_list("end_reason", flat=True)) == {"attempt ended"}
    assert not AllocationDevice.objects.filter(released=False).exists()
    assert sum(GpuDevice.objects.values_list("allocated_milli", flat=True)) == 0
    env.run(daemon)
    assert env.backend.list_pods() == []


def test_a_job_seen_started_and_finished_at_once_is_one_write_with_both_events(
    env: Env,
) -> None:
    job = env.submit(simulation={"duration_s": 1})
    daemon = env.daemon()
    env.run(daemon)  # placed and bound
    with CaptureQueriesContext(connection) as seen:
        env.run(daemon, seconds=5)  # the pod started and finished in between
    job.refresh_from_db()
    assert job.state == "succeeded" and job.started_at is not None
    assert states(job) == ["queued", "admitted", "binding", "running", "succeeded"]
    writes = [
        q["sql"]
        for q in seen.captured_queries
        if q["sql"].startswith(('UPDATE "scheduler_job" ', "UPDATE scheduler_job "))
    ]
    assert len(writes) == 1, writes
    assert_consistent(env.backend)


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
    # one leadership, not in the process.
    with django_assert_max_num_queries(13):
        built = build_snapshot(env.clock(), decayed={}, cache=cache)
    assert len(built.snapshot.running) == 3
    assert len(built.snapshot.pending) == 20
    assert len(built.snapshot.nodes) == 4
    # Warm: versions only (inventory and organisation, jobs), no whole rows, device shares,
    # tenants or old preemptions read again.
    # (SQLite has no row versions: it reads the cold set again, but no more.)
    with django_assert_max_num_queries(6 if connection.vendor == "postgresql" else 13):
        again = build_snapshot(env.clock(), decayed={}, cache=cache)
    assert again.snapshot == built.snapshot
    env.submit(user="bob-bravo", resources={"gpus": 8})
    heads = build_snapshot(env.clock(), decayed={}, per_queue=5).snapshot.pending
    # the 5 oldest of alpha's 20 (one tenant, one class) and bravo's one
    assert sorted(j.tenant for j in heads) == ["team-alpha"] * 5 + ["team-bravo"]


@pytest.mark.postgresql("the row-version (xmin) cache of a quiet cycle")
def test_a_quiet_cycle_reads_little(env: Env) -> None:
    """A cycle where nothing changed re-reads no job row, allocation or device share it
    already holds: reconcile reads allocations and their jobs' rows by version and hands
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
    assert len(sql) <= 9, "\n".join(sql)
    # the jobs holding allocations, read once by reconcile and handed to the snapshot
    holders = [q for q in sql if q.startswith('SELECT "scheduler_job"') and "EXISTS(" in q]
    assert len(holders) == 1, holders
    # the active allocations' versions, and no allocation row (none changed)
    assert sum(q.startswith("SELECT a.id, a.xmin") for q in sql) == 1
    assert not any(q.startswith('SELECT "scheduler_allocation"."id"') for q in sql)
    assert not any("scheduler_allocationdevice" in q and q.startswith("SELECT") for q in sql)
    assert not any('"scheduler_job"."spec" AS' in q for q in sql)  # scaling's read


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


def test_cached_rows_are_read_again_when_the_job_changes(env: Env) -> None:
    """The snapshot cache keys job rows by their PostgreSQL row version: any write to a job,
    by anyone, makes the next snapshot read its row again."""
    job = env.submit(resources={"gpus": 2})
    cache = SnapshotCache()
    first = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot.pending
    assert [(j.id, j.resources.gpu_milli) for j in first] == [(str(job.pk), 2000)]
    Job.objects.filter(pk=job.pk).update(gpu_milli_per_replica=3000)  # no updated_at bump
    again = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot.pending
    assert [(j.id, j.resources.gpu_milli) for j in again] == [(str(job.pk), 3000)]
    Job.objects.filter(pk=job.pk).update(state="cancelled")
    assert build_snapshot(env.clock(), decayed={}, cache=cache).snapshot.pending == ()
    assert cache.rows == {}


@pytest.mark.postgresql("job rows cached by row version (xmin)")
def test_the_engines_view_of_a_job_is_kept_while_what_it_is_made_of_is_unchanged(
    env: Env,
) -> None:
    """A job's row gets a new version at every step (a new reason, admitted, running), none
    of which the engine's view depends on: the same JobRequest is kept, and built again only
    when a field it is made of changes."""
    job = env.submit(resources={"gpus": 2})
    cache = SnapshotCache()
    [first] = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot.pending
    with transaction.atomic():  # a subtransaction: the row gets a version of its own
        Job.objects.filter(pk=job.pk).update(reason="waiting for 2 GPUs")
    [same] = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot.pending
    assert same is first and cache.rows[job.pk][1]["reason"] == "waiting for 2 GPUs"
    with transaction.atomic():
        Job.objects.filter(pk=job.pk).update(attempt=1)
    [again] = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot.pending
    assert again is not first and again.attempt == 1


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


def test_queue_window_takes_every_queues_heads_round_robin(env: Env) -> None:
    """When the queue heads are more than `max_pending`, each queue (tenant x priority class)
    gets its turn: high-priority jobs that cannot fit must not hide the low-priority ones
    that could fill the gaps."""
    high = [env.submit(priority_class="high") for _ in range(6)]
    low = [env.submit(priority_class="low") for _ in range(2)]
    seen = build_snapshot(env.clock(), decayed={}, max_pending=4, per_queue=5).snapshot.pending
    # round-robin: the first of each queue, then the second of each
    assert sorted(int(j.id) for j in seen) == sorted(j.pk for j in [*high[:2], *low])
    # ordered for the engine by priority, then age
    assert [int(j.id) for j in seen] == [j.pk for j in [*high[:2], *low]]
    # without per_queue: by priority, then age
    seen = build_snapshot(env.clock(), decayed={}, max_pending=4).snapshot.pending
    assert [int(j.id) for j in seen] == [j.pk for j in high[:4]]


@pytest.mark.postgresql(
    "queue_heads is PostgreSQL SQL (LATERAL); SQLite reads the window through the ORM"
)
def test_queue_heads_read_shallow_give_the_full_window(env: Env) -> None:
    """`queue_heads` reads each queue only as deep as the round-robin reaches, sized from the
    queues it found last time; whatever that guess, its window is the one the full-depth
    read gives, also when queues ran dry since (it must read again, deeper)."""

    def full(max_pending: int, per_queue: int) -> set[int]:
        return set(_queue(max_pending, per_queue).values_list("id", flat=True))

    def shallow(max_pending: int, per_queue: int) -> set[int]:
        return {job_id for job_id, _ in queue_heads(max_pending, per_queue)}

    classes = ("critical", "high", "normal", "low")
    jobs = {(user, c): [env.submit(user=user, priority_class=c) for _ in range(2)]
            for user in ("alice", "bob-bravo") for c in classes}  # fmt: skip
    jobs["alice", "normal"] += [env.submit(priority_class="normal") for _ in range(8)]
    # 8 queues: a window of 8 takes one head each, and the next read guesses depth 3
    assert shallow(8, 6) == full(8, 6) and len(full(8, 6)) == 8
    assert shallow(8, 6) == full(8, 6)
    # all but one queue run dry: depth 3 finds 3 jobs, so it must read to depth 6
    Job.objects.exclude(id__in=[j.pk for j in jobs["alice", "normal"]]).update(state="cancelled")
    assert len(full(8, 6)) == 6
    assert shallow(8, 6) == full(8, 6)
    # fewer jobs than the window: nothing left out
    assert shallow(20, 20) == full(20, 20) == {j.pk for j in jobs["alice", "normal"]}


def test_waiting_job_gets_a_reason(env: Env) -> None:
    env.submit(resources={"gpus": 8}, simulation={"duration_s": 600})
    job = env.submit(replicas=4, resources={"gpus": 8})  # 8 + 32: over team-alpha's limit 32
    env.run(env.daemon())
    job.refresh_from_db()
    assert job.state == "queued"
    assert job.reason.startswith("quota"), job.reason


def test_waiting_reasons_are_refreshed_at_the_daemons_pace(env: Env) -> None:
    daemon = env.daemon(reasons_every_s=1.0)
    env.submit(resources={"gpus": 8}, simulation={"duration_s": 600})
    first = env.submit(replicas=4, resources={"gpus": 8})  # 8 + 32: over team-alpha's limit
    env.run(daemon)
    first.refresh_from_db()
    assert first.reason.startswith("quota")
    second = env.submit(replicas=4, resources={"gpus": 8})
    env.run(daemon, seconds=0.5)  # within the second: not rewritten yet
    second.refresh_from_db()
    assert second.reason == ""
    env.run(daemon, seconds=0.5)
    second.refresh_from_db()
    assert second.reason.startswith("quota")


def test_failed_attempt_retries_with_backoff_then_fails(env: Env) -> None:
    job = env.submit(
        simulation={"duration_s": 10, "fail": True}, retry={"limit": 1, "backoff_s": 30}
    )
    daemon = env.daemon()
    env.run(daemon, cycles=2)
    env.run(daemon, seconds=12)
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("queued", 1)
    assert "retry in 30 s" in job.reason
    env.run(daemon, seconds=5)  # inside the backoff: not placed
    job.refresh_from_db()
    assert job.state == "queued"
    env.run(daemon, seconds=30, cycles=2)
    env.run(daemon, seconds=12)
    job.refresh_from_db()
    assert job.state == "failed"
    assert "exited with an error" in job.reason
    assert_consistent(env.backend)


@pytest.mark.parametrize(
    ("reason", "limit", "final_state", "text"),
    [
        (FailureReason.OOM_KILLED, 1, "queued", "OOMKilled"),
        (FailureReason.OOM_KILLED, 0, "failed", "OOMKilled"),
        (FailureReason.IMAGE_PULL, 3, "failed", "image pull"),
        (FailureReason.EVICTED, 0, "queued", "Evicted"),
        (FailureReason.NODE_LOST, 0, "queued", "node lost"),
        (FailureReason.DEADLINE_EXCEEDED, 3, "failed", "deadline"),
    ],
    ids=[
        "oom-retried",
        "oom-no-retries-left",
        "image-pull-final",
        "evicted-infra",
        "node-lost-infra",
        "deadline-final",
    ],
)
def test_pod_failure_reason_decides_retry(
    env: Env, reason: FailureReason, limit: int, final_state: str, text: str
) -> None:
    job = env.submit(retry={"limit": limit, "backoff_s": 10}, simulation={"duration_s": 100})
    daemon = env.daemon()
    env.run(daemon, seconds=2, cycles=2)
    env.backend.fail_pod(f"gantry-{job.pk}-a0-r0", reason, "from the test")
    env.run(daemon)
    job.refresh_from_db()
    event = JobEvent.objects.filter(job=job, kind="attempt_failed").get()
    assert text in event.message
    if final_state == "failed":
        assert job.state == "failed" and text in job.reason
        assert not Allocation.objects.filter(job=job, ended_at__isnull=True).exists()
    else:  # requeued with a new attempt (infra failures at once, so maybe placed again)
        assert event.to_state == "queued" and job.attempt == 1
        assert not Allocation.objects.filter(job=job, attempt=0, ended_at__isnull=True).exists()
    assert_consistent(env.backend)


def test_job_past_max_runtime_is_stopped(env: Env) -> None:
    job = env.submit(max_runtime_s=60, simulation={"duration_s": 1000})
    daemon = env.daemon()
    env.run(daemon, seconds=2, cycles=2)
    env.run(daemon, seconds=61)
    job.refresh_from_db()
    assert job.state == "failed"
    assert "max runtime" in job.reason
    env.run(daemon, seconds=3, cycles=2)
    assert env.backend.list_pods() == []


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


def test_preemption_waits_for_victims_to_stop(env: Env) -> None:
    low = [
        env.submit(resources={"gpus": 8}, priority_class="low", simulation={"duration_s": 10_000})
        for _ in range(4)
    ]
    daemon = env.daemon()
    daemon.profile = type(daemon.profile)(min_runtime_s=0)
    env.run(daemon, seconds=2, cycles=2)
    assert Job.objects.filter(state="running").count() == 4
    urgent = env.submit(
        user="alice",
        resources={"gpus": 8},
        priority_class="critical",
        simulation={"duration_s": 60},
    )
    env.run(daemon)
    urgent.refresh_from_db()
    victims = [j for j in low if Job.objects.get(pk=j.pk).state == "preempted"]
    assert len(victims) == 1
    assert urgent.state == "queued" and "preempting" in urgent.reason
    assert_consistent(env.backend)
    env.run(daemon, seconds=3, cycles=2)
    urgent.refresh_from_db()
    assert urgent.state in ("binding", "running")
    victim = Job.objects.get(pk=victims[0].pk)
    assert (victim.state, victim.attempt) == ("queued", 1)
    assert_consistent(env.backend)
    # The engine learns who displaced whom, so the victim's retry cannot preempt it back.
    running = build_snapshot(env.clock(), decayed={}).snapshot.running
    guard = {r.job.id: r.displaced for r in running}
    assert guard[str(urgent.pk)] == (str(victim.pk),)


def test_stale_snapshot_conflict_requeues_only_the_conflicting_jobs(
    env: Env, monkeypatch: Any
) -> None:
    from django.utils import timezone

    import scheduler.daemon.loop as daemon_module
    from scheduler.models import AllocationDevice, Node

    jobs = [env.submit(resources={"gpus": 8}, simulation={"duration_s": 600}) for _ in range(4)]
    daemon = env.daemon()
    env.run(daemon, cycles=0)
    real = daemon_module.build_snapshot

    def stale(*args: Any, **kwargs: Any) -> Any:
        built = real(*args, **kwargs)  # then, behind the snapshot's back, a rogue holder:
        rogue = Allocation.objects.create(
            job=jobs[0],
            node=Node.objects.get(name="h100-0000"),
            attempt=9,
            replica=0,
            pod_name="rogue",
            namespace="x",
            started_at=timezone.now(),
        )
        for device in GpuDevice.objects.filter(node__name="h100-0000"):
            AllocationDevice.objects.create(allocation=rogue, device=device, milli=1000)
        return built

    monkeypatch.setattr(daemon_module, "build_snapshot", stale)
    daemon.step()
    states = sorted(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("state", flat=True))
    assert states == ["binding", "binding", "binding", "queued"]
    conflicted = Job.objects.get(pk__in=[j.pk for j in jobs], state="queued")
    assert "conflicted" in conflicted.reason
    assert_consistent(env.backend)


def test_gpus_of_a_stopping_attempt_are_not_given_out(env: Env) -> None:
    """A failed gang's surviving pod keeps its GPUs until it is gone (FAULTS 17): the engine
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


def test_jobs_fitted_into_a_victims_leftover_wait_for_it_too(env: Env) -> None:
    """The engine frees a victim's 8 GPUs at once; the preemptor takes 4 and fits a second
    job into the other 4. Both wait until the victim's pod is gone, then start there."""
    low = [
        env.submit(resources={"gpus": 8}, priority_class="low", simulation={"duration_s": 10_000})
        for _ in range(4)
    ]
    daemon = env.daemon()
    daemon.profile = type(daemon.profile)(min_runtime_s=0)
    env.run(daemon, seconds=2, cycles=2)
    first, second = (
        env.submit(resources={"gpus": 4}, priority_class="critical", simulation={"duration_s": 60})
        for _ in range(2)
    )
    env.run(daemon)
    preempted = [j for j in low if Job.objects.get(pk=j.pk).state == "preempted"]
    assert len(preempted) == 1
    first.refresh_from_db()
    second.refresh_from_db()
    victim = preempted[0].pk
    assert (first.state, second.state) == ("queued", "queued")
    # the preemptor says so; the job fitted beside it waits for a job it did not preempt
    assert first.reason == f"preempting job(s) {victim}; starts when they have stopped"
    assert second.reason == f"waiting for job(s) {victim} to stop, preempted for other jobs"
    assert_consistent(env.backend)
    env.run(daemon, seconds=3, cycles=2)
    nodes = set()
    for job in (first, second):
        job.refresh_from_db()
        assert job.state in ("binding", "running")
        nodes.add(Allocation.objects.get(job=job, ended_at__isnull=True).node_id)
    assert len(nodes) == 1  # both on the victim's node
    assert_consistent(env.backend)


@pytest.mark.postgresql("the organisation cached by row versions (xmin)")
def test_organisation_is_read_again_only_when_it_changed(env: Env) -> None:
    """Tenants, quotas and priority classes come from the cache while their row versions
    are unchanged; any write to one of them (by anyone) is seen at the next snapshot, and
    the engine's views of the jobs name the new values."""
    from tenants.models import PriorityClass, Quota

    job = env.submit(resources={"gpus": 2})
    cache = SnapshotCache()
    first = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot
    with CaptureQueriesContext(connection) as warm:
        again = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot
    read = " ".join(q["sql"] for q in warm.captured_queries)
    assert 'FROM "tenants_quota"' not in read and 'FROM "tenants_tenant"' not in read
    assert again.tenants == first.tenants
    assert again.pending[0] is first.pending[0]  # the same view, not built again
    quota = Quota.objects.get(tenant=env.org.alpha, flavor__name="H100-80GB")
    # Each write in its own (sub)transaction, as the API makes them: a new row version.
    with transaction.atomic():
        Quota.objects.filter(pk=quota.pk).update(guaranteed_milli=quota.guaranteed_milli - 1000)
    changed = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot
    alpha = {t.name: t for t in changed.tenants}["team-alpha"]
    assert alpha.quotas["H100-80GB"].guaranteed == quota.guaranteed_milli - 1000
    pc = PriorityClass.objects.get(pk=job.priority_class_id)
    with transaction.atomic():
        PriorityClass.objects.filter(pk=pc.pk).update(name="renamed")
    renamed = build_snapshot(env.clock(), decayed={}, cache=cache).snapshot
    assert [j.priority_class for j in renamed.pending] == ["renamed"]


def test_recent_preemptions_are_read_incrementally(env: Env) -> None:
    """The ping-pong guard's preemptions are read after the last event the cache holds:
    a new one is seen at the next snapshot, and one past the look-back is dropped; the
    preemptor -> victims map is rebuilt only when they change."""
    from datetime import timedelta

    from django.utils import timezone

    from scheduler.daemon.snapshot import DISPLACED_LOOKBACK_S, _displaced

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


@pytest.mark.postgresql("job rows cached by row version (xmin)")
def test_the_daemons_own_writes_keep_the_row_cache_exact(env: Env) -> None:
    """Claims, binds and waiting reasons written by the daemon hand their new row versions
    to the cache, and new allocations their device shares: the next snapshot reads none of
    them again, and equals a snapshot built from scratch."""
    for _ in range(2):
        env.submit(resources={"gpus": 4}, simulation={"duration_s": 600})
    for _ in range(3):
        env.submit(replicas=4, resources={"gpus": 8})  # 8 + 32 over quota 32: they wait
    daemon = env.daemon(sync_every_s=60)
    env.run(daemon)
    assert Job.objects.filter(state="binding").count() == 2
    assert Job.objects.exclude(reason="").filter(state="queued").count() == 3
    with CaptureQueriesContext(connection) as seen:
        warm = build_snapshot(env.clock(), decayed={}, cache=daemon.cache)
    whole = [q["sql"] for q in seen.captured_queries if '"scheduler_job"."queued_at"' in q["sql"]]
    assert whole == [], "job rows read again"
    shares = [q["sql"] for q in seen.captured_queries if "scheduler_allocationdevice" in q["sql"]]
    assert shares == [], "device shares read back"
    cold = build_snapshot(env.clock(), decayed={})
    assert warm.snapshot == cold.snapshot
    assert warm.jobs == cold.jobs


def test_reasons_are_written_only_to_queued_jobs(env: Env) -> None:
    from scheduler.daemon.store import set_reasons

    queued, cancelled = env.submit(), env.submit()
    Job.objects.filter(pk=cancelled.pk).update(state="cancelled", reason="cancelled by alice")
    versions: dict[int, int] = {}
    assert set_reasons({queued.pk: "waiting", cancelled.pk: "waiting"}, versions) == 1
    # the new row version is known on PostgreSQL only (xmin)
    assert list(versions) == ([queued.pk] if connection.vendor == "postgresql" else [])
    assert Job.objects.get(pk=cancelled.pk).reason == "cancelled by alice"
    assert Job.objects.get(pk=queued.pk).reason == "waiting"


def test_a_preempted_job_with_nothing_running_is_requeued_by_the_sweep(env: Env) -> None:
    """Requeueing after preemption is checked for the jobs whose last allocation ended in
    the cycle, and for every preempted job every few seconds (level-based)."""
    job = env.submit()
    Job.objects.filter(pk=job.pk).update(state="preempted", reason="preempted: test")
    daemon = env.daemon()
    env.run(daemon)  # the first cycle sweeps (and places the job again)
    job.refresh_from_db()
    assert job.attempt == 1 and job.state in ("queued", "admitted", "binding")
    assert JobEvent.objects.filter(job=job, message__startswith="Back in the queue").exists()
    again = env.submit()
    Job.objects.filter(pk=again.pk).update(state="preempted")
    env.run(daemon, seconds=0.5)  # not due yet
    assert Job.objects.get(pk=again.pk).state == "preempted"
    env.run(daemon, seconds=2.0)
    assert Job.objects.get(pk=again.pk).attempt == 1


def test_lease_is_renewed_a_few_times_per_ttl_not_every_cycle(env: Env) -> None:
    from scheduler.models import SchedulerLease

    daemon = env.daemon()  # TTL 30 s: renewed every 5 s of the daemon's clock
    env.run(daemon)
    renewed = SchedulerLease.objects.get().renewed_at
    env.run(daemon, seconds=1, cycles=3)
    assert SchedulerLease.objects.get().renewed_at == renewed
    env.run(daemon, seconds=3)
    assert SchedulerLease.objects.get().renewed_at > renewed


def test_reasons_are_written_after_the_placed_jobs_are_bound(env: Env) -> None:
    """Hundreds of waiting reasons must not delay the placed jobs' start: the claim
    transaction holds no reason write, and the reasons follow the binds."""
    placed = env.submit(simulation={"duration_s": 600})
    waiting = env.submit(replicas=4, resources={"gpus": 8})  # 4 + 32 over quota 32
    with CaptureQueriesContext(connection) as seen:
        env.run(env.daemon())
    sql = [q["sql"] for q in seen.captured_queries]
    claim, reason = (
        ("SET state = 'binding'", "SET reason = v.reason")
        if connection.vendor == "postgresql"
        else ("SET \"state\" = 'binding'", 'SET "reason" = \'quota')
    )
    binding = next(i for i, q in enumerate(sql) if claim in q)
    reasons = next(i for i, q in enumerate(sql) if reason in q)
    assert binding < reasons
    placed.refresh_from_db()
    waiting.refresh_from_db()
    assert placed.state == "binding" and waiting.reason.startswith("quota")


def test_transitions_to_one_state_are_one_update_whatever_their_reasons(env: Env) -> None:
    """Every preempted job carries its own reason; requeueing many is still one UPDATE
    (PostgreSQL), each job with its own reason, backoff and attempt."""
    from datetime import timedelta

    from django.utils import timezone

    from scheduler.transitions import Change, transition_many

    jobs = [env.submit() for _ in range(3)]
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(state="preempted")
    now = timezone.now()
    changes = [
        Change(
            j.pk,
            ("preempted",),
            "queued",
            reason=f"preempted by {i}",
            new_attempt=True,
            not_before=now + timedelta(seconds=i),
        )
        for i, j in enumerate(jobs)
    ]
    with CaptureQueriesContext(connection) as seen, transaction.atomic():
        done = transition_many(changes, now)
    assert sorted(done.done) == sorted(j.pk for j in jobs)
    updates = [q["sql"] for q in seen.captured_queries if q["sql"].startswith("UPDATE")]
    # Elsewhere (SQLite, the embedded default): one UPDATE per distinct reason and backoff.
    assert len(updates) == (1 if connection.vendor == "postgresql" else 3), updates
    for i, job in enumerate(jobs):
        job.refresh_from_db()
        assert (job.state, job.reason, job.attempt) == ("queued", f"preempted by {i}", 1)
        assert job.not_before == now + timedelta(seconds=i)
        assert job.queued_at == now


@pytest.mark.postgresql("the planner's choice of index")
@pytest.mark.parametrize("statement", ["claim", "reasons"])
def test_compare_and_swaps_find_their_rows_by_key_whatever_the_statistics(
    env: Env, statement: str
) -> None:
    """The claim's and the reasons' UPDATEs find the jobs they write by primary key. With
    the state test written plainly, the planner took the partial index of queued jobs
    after a burst of submissions it had no statistics for, and read every queued job to
    write a hundred (the statistics below say the queue holds one)."""
    from scheduler.daemon.store import REASONS_SQL
    from scheduler.transitions import CLAIM_SQL

    first = env.submit()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE scheduler_job")
    fields = _columns(first)
    burst = Job.objects.bulk_create([Job(**fields) for _ in range(3000)])
    ids = [job.pk for job in burst[:100]]
    if statement == "claim":
        sql, params = CLAIM_SQL.format(started=""), ["admitted", "", timezone.now(), ids, "queued"]
    else:
        sql, params = REASONS_SQL, [ids, ["waiting"] * len(ids), "queued"]
    with connection.cursor() as cursor:
        # Which index, is the question: in a test database bloated by earlier tests' rolled
        # back rows, stale statistics can make a sequential scan cost least, which says
        # nothing about the indexes (and does not happen on a table as large as it looks).
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "scheduler_job_pkey" in plan, plan
    assert "job_queue_heads" not in plan and "job_queue_order" not in plan, plan


@pytest.mark.postgresql("the planner's choice of index")
def test_release_finds_its_allocations_by_key_whatever_the_statistics(env: Env) -> None:
    """Ending allocations finds them by primary key. With `ended_at IS NULL` written
    plainly, the planner took a partial index of the active allocations after a burst it
    had no statistics for (and such an index keeps an entry for every allocation ended
    since the last VACUUM)."""
    from scheduler.daemon.store import RELEASE_SQL

    env.submit(simulation={"duration_s": 600})
    env.run(env.daemon())
    first = Allocation.objects.get()
    fields = _columns(first)
    ended = [
        Allocation(**{**fields, "replica": i + 1, "ended_at": timezone.now()}) for i in range(3000)
    ]
    Allocation.objects.bulk_create(ended)  # the history: many ended, one active
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE scheduler_allocation")
    burst = Allocation.objects.bulk_create(
        [Allocation(**{**fields, "replica": i + 1, "pod_name": f"burst-{i}"}) for i in range(3000)]
    )
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + RELEASE_SQL, [timezone.now(), "x", [a.pk for a in burst[:100]]])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "scheduler_allocation_pkey" in plan, plan
    assert "allocation_one_active" not in plan and "allocation_active" not in plan, plan
    assert release([a.pk for a in burst[:100]], timezone.now(), "x") == 100
    assert release([a.pk for a in burst[:100]], timezone.now(), "x") == 0  # ended already


@pytest.mark.postgresql("ANALYZE and pg_stat counters")
def test_the_daemon_analyses_its_tables_once_they_outgrow_their_statistics(tenv: Env) -> None:
    """A table the daemon plans against that changed by more rows than it held at its last
    ANALYZE (and by 1,000) is analysed within `STATISTICS_EVERY_S`, not after autovacuum's
    naptime: a new installation under load was planned blind for its first minute."""
    from scheduler.daemon.upkeep import STATISTICS_EVERY_S

    def analysed(table: str) -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = %s", [table]
            )
            return int(cursor.fetchone()[0])

    daemon = tenv.daemon()
    first = tenv.submit()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE scheduler_job")
    before = analysed("scheduler_job")
    fields = _columns(first)
    Job.objects.bulk_create([Job(**fields) for _ in range(1500)])
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # counted once this one ends
    assert daemon.statistics.refresh(tenv.clock()) == ["scheduler_job"]
    assert analysed("scheduler_job") == before + 1
    tenv.clock.advance(STATISTICS_EVERY_S)
    assert daemon.statistics.refresh(tenv.clock()) == []  # current again
    Job.objects.bulk_create([Job(**fields) for _ in range(1200)])
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    # looked at most every STATISTICS_EVERY_S
    assert daemon.statistics.refresh(tenv.clock()) == []
    tenv.clock.advance(STATISTICS_EVERY_S)
    assert (
        daemon.statistics.refresh(tenv.clock()) == []
    )  # 1,200 new rows: fewer than the 1,501 it held
