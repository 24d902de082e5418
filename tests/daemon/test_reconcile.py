"""Reconcile (`scheduler.daemon.reconcile`): the rows it hands the snapshot, the starts written
after the binds, the pods listed after its reads, allocations by row version, orphans and
vanished pods.

Issue 17: pods that behave as a real cluster's do when things go wrong. A pod that never
starts (an image that never pulls) fails its job's attempt at the binding deadline, with the
cause the cluster reports (point 2); a pod stuck Terminating on a dead node counts as gone
once the node has been lost for a grace period (point 11)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.expressions import RawSQL
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduler.daemon.reconcile import active_allocations
from scheduler.models import Allocation, GpuDevice, Job, JobEvent, Node
from scheduler.nodes.services import node_drain
from scheduler.snapshot.build import build_snapshot
from scheduler.snapshot.cache import SnapshotCache
from tests.daemon.conftest import Env, assert_consistent

TIMEOUT = 600.0  # the daemon's binding deadline in these tests (the default)
GRACE = 300.0  # the daemon's node-lost grace in these tests (the default)


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
    assert built.jobs[keeps.pk]["state"] == "binding"  # as read: written after the binds
    assert again.jobs[keeps.pk]["state"] == "running"
    version = daemon.cache.rows[keeps.pk][0]
    row_version = RawSQL("xmin::text::bigint", ())
    current = Job.objects.annotate(v=row_version).values_list("v", flat=True).get(pk=keeps.pk)
    assert version == current
    keeps.refresh_from_db()
    ends.refresh_from_db()
    assert (keeps.state, ends.state) == ("running", "succeeded")


@pytest.mark.postgresql("row versions (xmin) tell the writing transaction")
def test_the_starts_are_written_in_the_transaction_that_commits_the_binds(env: Env) -> None:
    """A cycle that binds writes its starts at the end of the commit's transaction (one
    transaction, fence and commit fewer): the started job's row and the bound job's row get
    the same version. A cycle that binds nothing writes them in a transaction of its own."""
    row_version = RawSQL("xmin::text::bigint", ())
    first = env.submit(simulation={"duration_s": 600})
    daemon = env.daemon()
    env.run(daemon)  # placed and bound
    env.clock.advance(5)  # its pods started
    second = env.submit(simulation={"duration_s": 600})
    stats = daemon.cycle()
    assert (stats.started, stats.pods_bound) == (1, 1)
    rows = dict(Job.objects.annotate(v=row_version).values_list("id", "v"))
    assert rows[first.pk] == rows[second.pk]
    assert daemon.cache.rows[first.pk] == (rows[first.pk], daemon.cache.rows[first.pk][1])
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.state, second.state) == ("running", "binding")
    env.clock.advance(5)
    stats = daemon.cycle()
    assert (stats.started, stats.pods_bound) == (1, 0)
    second.refresh_from_db()
    assert second.state == "running"


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
    assert daemon.last is not None and daemon.last.started == 1


@pytest.mark.postgresql("allocations cached by row version (xmin)")
def test_allocations_are_read_again_when_they_or_their_node_change(env: Env) -> None:
    """Reconcile keeps active allocations by row version (the allocation's and its node's):
    a write to either, by anyone, reads the row again; an ended one drops out."""
    job = env.submit(simulation={"duration_s": 600})
    daemon = env.daemon()
    env.run(daemon, seconds=1, cycles=2)
    [alloc] = active_allocations(daemon.cache).allocations
    assert alloc["job_id"] == job.pk and alloc["node__ready"] is True
    assert active_allocations(daemon.cache).allocations[0] is alloc  # unchanged: the cached row
    Allocation.objects.filter(pk=alloc["id"]).update(end_reason="scaled down")
    [again] = active_allocations(daemon.cache).allocations
    assert again["end_reason"] == "scaled down"
    Node.objects.filter(name=alloc["node__name"]).update(ready=False)
    [third] = active_allocations(daemon.cache).allocations
    assert third["node__ready"] is False
    Allocation.objects.filter(pk=alloc["id"]).update(ended_at=timezone.now())
    assert active_allocations(daemon.cache).allocations == []
    assert daemon.cache.allocations == {}


def test_the_unhealthy_devices_come_with_the_active_allocations(env: Env) -> None:
    """The devices turned unhealthy are found by the active allocations' read (on
    PostgreSQL, the same statement: no read of the devices of its own every cycle), and a
    job holding one fails over."""
    job = env.submit(simulation={"duration_s": 600})
    daemon = env.daemon()
    env.run(daemon, seconds=1, cycles=2)
    [alloc] = active_allocations(daemon.cache).allocations
    assert active_allocations(daemon.cache).unhealthy == []
    device = GpuDevice.objects.filter(shares__allocation_id=alloc["id"]).first()
    assert device is not None
    GpuDevice.objects.filter(pk=device.pk).update(healthy=False)
    with CaptureQueriesContext(connection) as sent:
        assert active_allocations(daemon.cache).unhealthy == [device.pk]
    if connection.vendor == "postgresql":
        devices = [q["sql"] for q in sent.captured_queries if "scheduler_gpudevice" in q["sql"]]
        assert len(devices) == 1 and "scheduler_allocation" in devices[0], devices
    env.run(daemon)
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("queued", 1)
    event = JobEvent.objects.filter(job=job, kind="attempt_failed").get()
    assert "turned unhealthy" in event.message, event.message


@pytest.mark.postgresql("job rows cached by row version (xmin)")
def test_the_jobs_holding_allocations_come_with_them_read_again_when_changed(env: Env) -> None:
    """The same read gives the rows of the jobs holding the allocations: kept while their
    version holds, read again after any writer changed them, gone with the allocation."""
    job = env.submit(simulation={"duration_s": 600})
    daemon = env.daemon()
    env.run(daemon, seconds=1, cycles=2)
    first = active_allocations(daemon.cache)
    assert list(first.jobs) == [job.pk]
    assert active_allocations(daemon.cache).jobs[job.pk] is first.jobs[job.pk]  # cached
    Job.objects.filter(pk=job.pk).update(reason="written by someone else")
    assert active_allocations(daemon.cache).jobs[job.pk]["reason"] == "written by someone else"
    Allocation.objects.filter(job=job).update(ended_at=timezone.now())
    assert active_allocations(daemon.cache).jobs == {}


def test_orphan_pod_is_deleted_and_vanished_pod_fails_over(env: Env) -> None:
    job = env.submit(simulation={"duration_s": 600})
    daemon = env.daemon()
    env.run(daemon, seconds=2, cycles=2)
    from scheduler.daemon.apply import pod_request
    from scheduler.snapshot.rows import ROW_FIELDS

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


def _allocated() -> int:
    return sum(GpuDevice.objects.values_list("allocated_milli", flat=True))


def test_a_pod_that_never_starts_fails_its_attempt_at_the_binding_deadline(env: Env) -> None:
    job = env.submit(retry={"limit": 1, "backoff_s": 0}, simulation={"duration_s": 600})
    env.backend.never_start(job.pk, "ImagePullBackOff", 'Back-off pulling image "bad:1"')
    daemon = env.daemon(binding_timeout_s=TIMEOUT)
    env.run(daemon)
    env.run(daemon, seconds=TIMEOUT - 1)  # Pending, but not for long enough yet
    job.refresh_from_db()
    assert job.state == "binding"
    (pod,) = env.backend.list_pods()
    assert "ImagePullBackOff" in pod.waiting
    env.run(daemon, seconds=2)  # past the deadline: the attempt fails, retried per policy
    job.refresh_from_db()
    assert job.attempt == 1 and job.state in ("queued", "binding")
    failed = JobEvent.objects.get(job=job, kind="attempt_failed")
    assert failed.data == {"reason": "StartTimeout"}
    assert 'ImagePullBackOff: Back-off pulling image "bad:1"' in failed.message
    assert "retry 1 of 1" in failed.message
    env.run(daemon, seconds=3, cycles=2)  # the old pod is gone; the retry is bound
    job.refresh_from_db()
    assert job.state == "binding"
    assert Allocation.objects.filter(job=job, ended_at__isnull=True).get().attempt == 1
    env.run(daemon, seconds=TIMEOUT + 1)  # the retry never starts either: out of retries
    job.refresh_from_db()
    assert job.state == "failed"
    assert "did not start" in job.reason and "ImagePullBackOff" in job.reason
    env.run(daemon, seconds=3, cycles=2)
    assert not Allocation.objects.filter(ended_at__isnull=True).exists()
    assert _allocated() == 0  # the devices (and quota) went back
    assert_consistent(env.backend)


def test_a_pod_without_a_reported_cause_fails_at_the_deadline_too(env: Env) -> None:
    env.backend.start_delay_s = 10**9  # Pending for ever, the kubelet saying nothing
    job = env.submit(simulation={"duration_s": 600})
    daemon = env.daemon(binding_timeout_s=TIMEOUT)
    env.run(daemon)
    env.run(daemon, seconds=TIMEOUT + 1)
    job.refresh_from_db()
    assert job.state == "failed"
    assert "the cluster reports no cause" in job.reason
    assert Job.objects.get(pk=job.pk).finished_at is not None


def test_a_preempted_job_stuck_terminating_on_a_dead_node_is_requeued_after_the_grace(
    env: Env,
) -> None:
    """The job is preempted (its node drained), and the node dies before the pod's deletion
    is confirmed: Terminating for ever, as on Kubernetes. Once the node has been lost for
    the grace, the pod counts as gone (force-deleted) and the job goes back to the queue."""
    job = env.submit(simulation={"duration_s": 10_000})
    daemon = env.daemon(node_lost_grace_s=GRACE)
    env.run(daemon, seconds=2, cycles=2)
    job.refresh_from_db()
    assert job.state == "running"
    node = Allocation.objects.get(job=job).node
    node_drain(user=env.org.users["pat"], node=node, reason="maintenance")
    env.run(daemon)  # preempted; its pod's graceful deletion is sent
    env.backend.partition_node(node.name)  # ... and the node dies before confirming it
    env.run(daemon, seconds=GRACE - 10, cycles=2)
    job.refresh_from_db()
    assert job.state == "preempted"  # inside the grace: the pod may still be running there
    (pod,) = env.backend.list_pods()
    assert pod.deleting  # Terminating
    assert Allocation.objects.get(job=job).ended_at is None
    env.run(daemon, seconds=20)  # past the grace
    job.refresh_from_db()
    assert job.attempt == 1 and job.state in ("queued", "binding")
    assert Allocation.objects.get(job=job, attempt=0).ended_at is not None
    assert [p for p in env.backend.list_pods() if p.attempt == 0] == []  # force-deleted
    env.run(daemon, seconds=3, cycles=2)
    job.refresh_from_db()
    assert job.state == "running"
    assert Allocation.objects.get(job=job, attempt=1).node_id != node.pk
    assert_consistent(env.backend)


def test_a_running_job_on_a_node_that_stops_reporting_fails_over_and_frees_its_gpus(
    env: Env,
) -> None:
    job = env.submit(simulation={"duration_s": 10_000})
    daemon = env.daemon(node_lost_grace_s=GRACE)
    env.run(daemon, seconds=2, cycles=2)
    node = Allocation.objects.get(job=job).node
    env.backend.partition_node(node.name)
    env.run(daemon, seconds=1)  # NotReady: the attempt fails (node lost), retried elsewhere
    job.refresh_from_db()
    assert job.attempt == 1
    stuck = Allocation.objects.get(job=job, attempt=0)
    env.run(daemon, seconds=GRACE / 2)
    stuck.refresh_from_db()
    assert stuck.ended_at is None  # its pod is Terminating on the dead node
    env.run(daemon, seconds=GRACE)
    stuck.refresh_from_db()
    assert stuck.ended_at is not None
    assert GpuDevice.objects.filter(node=node, allocated_milli__gt=0).count() == 0
    assert_consistent(env.backend)
