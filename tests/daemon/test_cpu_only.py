"""Jobs without GPUs cannot strand a GPU node's GPUs through the daemon either (issue 34,
item 17; the rule: docs/engine.md, "Jobs without GPUs")."""

from __future__ import annotations

from scheduler.models import Job
from tests.daemon.conftest import Env


def test_cpu_only_jobs_leave_an_8_gpu_job_its_node(env: Env) -> None:
    # 4 nodes of 8 H100, 128 cores and 1 TiB each. bob-bravo's four CPU-only jobs ask
    # 100 cores and 900 GiB each (a node each, before: every node's CPU taken); at most
    # 1/8 of a GPU node (16 cores, 128 GiB) is theirs, so they wait, told why.
    cpu_only = [
        env.submit(
            "bob-bravo",
            name=f"etl-{n}",
            resources={"gpus": 0, "cpu_milli": 100_000, "memory_mib": 900 * 1024},
            simulation={"duration_s": 600},
        )
        for n in range(4)
    ]
    big = env.submit(
        resources={"gpus": 8, "cpu_milli": 112_000, "memory_mib": 896 * 1024},
        simulation={"duration_s": 600},
    )
    daemon = env.daemon()
    env.run(daemon, seconds=1, cycles=2)
    big.refresh_from_db()
    assert big.state in ("binding", "running"), big.reason
    for job in Job.objects.filter(pk__in=[j.pk for j in cpu_only]):
        assert job.state == "queued"
        assert "for jobs without GPUs (the rest is kept for GPU jobs)" in job.reason
