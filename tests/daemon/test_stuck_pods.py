"""Issue 17: pods that behave as a real cluster's do when things go wrong. A pod that never
starts (an image that never pulls) fails its job's attempt at the binding deadline, with the
cause the cluster reports (point 2); a pod stuck Terminating on a dead node counts as gone
once the node has been lost for a grace period (point 11)."""

from __future__ import annotations

from scheduler.models import Allocation, GpuDevice, Job, JobEvent
from scheduler.nodes import node_drain
from tests.daemon.conftest import Env, assert_consistent

TIMEOUT = 600.0  # the daemon's binding deadline in these tests (the default)


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


GRACE = 300.0  # the daemon's node-lost grace in these tests (the default)


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
