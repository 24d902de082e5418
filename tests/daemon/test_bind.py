"""Issue 17: binds that fail. Their commit never leaves a job admitted without an allocation
(point 11), and a bind refused again and again ends in a failed job with its cause instead of
a retry forever (point 8)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.backends.base import BackendError
from scheduler.models import Allocation, Job, JobEvent
from tests.daemon.conftest import Env, assert_consistent
from tests.daemon.test_faults import pg


@pytest.mark.postgresql("a row lock held by a second connection")
def test_a_failed_bind_of_a_locked_job_keeps_its_allocation_until_the_claim_is_released(
    tenv: Env,
) -> None:
    """Forced interleaving: between the failed bind and its commit, another session locks
    the job's row, so the requeue (a skip-locked compare-and-swap) skips it. The commit
    must not release the allocation of a job it leaves admitted."""
    job = tenv.submit(simulation={"duration_s": 600})
    tenv.backend.inject("bind_pod", BackendError("500 Internal Server Error"), times=4)
    other: Any = pg()

    def lock() -> None:
        other.execute("BEGIN")
        other.execute("SELECT id FROM scheduler_job WHERE id = %s FOR UPDATE", [job.pk])

    daemon = tenv.daemon(hooks={"bound": lock})
    try:
        tenv.run(daemon)
        job.refresh_from_db()
        assert job.state == "admitted"  # the requeue was skipped: the row was locked
        held = Allocation.objects.filter(job=job, ended_at__isnull=True)
        assert held.count() == 1  # ... and the claim still holds its allocation
    finally:
        other.execute("ROLLBACK")
        other.close()
    daemon.hooks = {}
    tenv.run(daemon)  # reconcile: the claim's pod is gone, so the claim is released
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("binding", 1)  # released, then placed again
    assert JobEvent.objects.filter(job=job, from_state="admitted", to_state="queued").exists()
    assert Allocation.objects.filter(job=job, ended_at__isnull=True).get().attempt == 1
    assert_consistent(tenv.backend)


def test_an_admitted_job_without_an_allocation_goes_back_to_the_queue(env: Env) -> None:
    """Level-based: whatever left a claim without its allocation (a crash, a locked row),
    reconcile's sweep returns it to the queue."""
    job = env.submit(simulation={"duration_s": 600})
    Job.objects.filter(pk=job.pk).update(state="admitted")
    daemon = env.daemon()
    env.run(daemon)
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("binding", 1)  # released, then placed again
    released = JobEvent.objects.get(job=job, from_state="admitted", to_state="queued")
    assert "held no allocation" in released.message
    assert_consistent(env.backend)


def test_a_bind_refused_every_time_fails_the_job_after_the_attempt_limit(env: Env) -> None:
    """The API server refuses the pod (an environment variable name it rejects): after
    `bind_attempts` tries the job fails with that cause, instead of being placed again,
    and preempting others for it, for ever."""
    job = env.submit(simulation={"duration_s": 600})
    refused = BackendError("apiserver 422: Unprocessable Entity: env name 'A\\n' is invalid")
    env.backend.inject("create_pod", refused, times=1000)
    daemon = env.daemon(bind_attempts=3)
    for _ in range(3):
        env.run(daemon, seconds=400)  # past each retry's backoff
    job.refresh_from_db()
    assert job.state == "failed"
    assert "422" in job.reason and "3 times" in job.reason
    tries = JobEvent.objects.filter(job=job, kind="bind_failed")
    assert list(tries.values_list("to_state", flat=True)) == ["queued", "queued", "failed"]
    assert not Allocation.objects.filter(job=job, ended_at__isnull=True).exists()
    calls = env.backend.calls["create_pod"]
    env.run(daemon, seconds=400, cycles=3)
    assert env.backend.calls["create_pod"] == calls  # never tried again
    assert_consistent(env.backend)
