"""Issue 17: pods that behave as a real cluster's do when things go wrong. A pod that never
starts (an image that never pulls) fails its job's attempt at the binding deadline, with the
cause the cluster reports (point 2); a pod stuck Terminating on a dead node counts as gone
once the node has been lost for a grace period (point 11)."""

from __future__ import annotations

from scheduler.models import Allocation, GpuDevice, Job, JobEvent
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
