"""Issue 17, point 10: a preempted job's quota is held, like its devices, until its pods are
gone; it is not handed to jobs admitted in the same cycle (a chaos run saw limits exceeded for
1.4-2 s while victims terminated)."""

from __future__ import annotations

from scheduler.models import Allocation, Job
from scheduler.services import job_submit
from tenants.models import Quota
from tests.conftest import job_spec
from tests.daemon.conftest import Env, assert_consistent


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
