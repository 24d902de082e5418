"""Issue 17: binds that fail. Their commit never leaves a job admitted without an allocation
(point 11), and a bind refused again and again ends in a failed job with its cause instead of
a retry forever (point 8)."""

from __future__ import annotations

from typing import Any

from scheduler.backends.base import BackendError
from scheduler.models import Allocation, Job, JobEvent
from tests.daemon.conftest import Env, assert_consistent
from tests.daemon.test_faults import pg


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
