"""Inference autoscaling (`scheduler.daemon.autoscaling`): replicas follow the backend's load
signal within [min_replicas, max_replicas]."""

from __future__ import annotations

from scheduler.models import Allocation
from tests.daemon.conftest import Env, assert_consistent


def test_inference_scales_with_load_within_bounds(env: Env) -> None:
    load = {"value": 3.0}
    env.backend.inference_load = lambda job_id, now=None: load["value"]  # type: ignore[method-assign]
    job = env.submit(type="inference", replicas=1, min_replicas=1, max_replicas=3,
                     resources={"gpus": 1})  # fmt: skip
    daemon = env.daemon()
    env.run(daemon, seconds=2, cycles=3)
    job.refresh_from_db()
    assert job.replicas == 3
    active = Allocation.objects.filter(job=job, ended_at__isnull=True)
    assert sorted(active.values_list("replica", "elastic")) == [(0, False), (1, True), (2, True)]
    load["value"] = 9.0  # capped at max_replicas
    env.run(daemon, seconds=2)
    job.refresh_from_db()
    assert job.replicas == 3
    load["value"] = 0.4  # floored at min_replicas
    env.run(daemon, seconds=3, cycles=3)
    job.refresh_from_db()
    assert job.replicas == 1 and job.state == "running"
    assert list(Allocation.objects.filter(job=job, ended_at__isnull=True)
                .values_list("replica", flat=True)) == [0]  # fmt: skip
    assert_consistent(env.backend)
