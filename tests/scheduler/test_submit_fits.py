"""Submit refuses a job that can never run (issue 17, point 12): no node of the inventory
could hold it, or its tenant's quotas never admit it; the 400 names the field and why."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from scheduler.core import Profile
from scheduler.jobs.services import job_submit
from scheduler.models import GpuDevice, Job, Node, SchedulingProfileRecord
from tenants.models import Quota
from tests import factories as f
from tests.conftest import Org, job_spec

JOBS = "/api/v1/jobs/"


def gpu_node(name: str, flavor: str, gpus: int, memory_mib: int, **fields: Any) -> Node:
    node = f.NodeFactory(name=name, flavor=flavor, **fields)
    for index in range(gpus):
        GpuDevice.objects.create(node=node, index=index, model=flavor, memory_mib=memory_mib)
    return node


@pytest.fixture
def inventory(org: Org) -> None:
    """Two A100-40GB and two H100-80GB nodes of 8 GPUs; team-alpha holds H100 quota only."""
    for i in (1, 2):
        gpu_node(f"a100-{i}", "A100-40GB", 8, 40960)
        gpu_node(f"h100-{i}", "H100-80GB", 8, 81920)


def refused(org: Org, **spec: Any) -> dict[str, Any]:
    with pytest.raises(ValidationError) as info:
        job_submit(user=org.users["alice"], project=org.proj_alpha, payload=job_spec(**spec))
    assert Job.objects.count() == 0
    detail: dict[str, Any] = info.value.detail  # type: ignore[assignment]
    return detail


def test_gpu_memory_no_device_has_is_refused_naming_the_largest_device(
    org: Org, inventory: None
) -> None:
    # was accepted, then waited on "no A100-40GB device has 200000 MiB ... the most is 40960"
    errors = refused(
        org,
        replicas=1,
        flavors=[],
        resources={"gpu_milli": 500, "gpu_memory_mib": 200000},
    )
    (message,) = errors["resources"]["gpu_memory_mib"]
    assert "no H100-80GB node has a GPU with 200000 MiB of GPU memory; the most is 81920" in message
    assert "A100-40GB, H100-80GB" in message


def test_more_gpus_per_replica_than_any_node_has_is_refused(org: Org, inventory: None) -> None:
    # was accepted, then waited on "no node has 16 free L40S-48GB together"
    errors = refused(org, replicas=1, flavors=[], resources={"gpus": 16})
    (message,) = errors["resources"]["gpus"]
    assert "no A100-40GB or H100-80GB node has 16 GPUs; the most on one node is 8" in message


def test_gang_larger_than_the_inventory_is_refused_on_replicas(org: Org, inventory: None) -> None:
    # 3 replicas of 8 H100 at once; the two H100 nodes hold 2
    errors = refused(org, replicas=3, resources={"gpus": 8})
    assert "all H100-80GB nodes together hold 2 of the 3 replicas" in errors["replicas"][0]


def test_flavor_without_quota_in_the_tree_is_refused(org: Org, inventory: None) -> None:
    errors = refused(org, replicas=1, flavors=["A100-40GB"], resources={"gpus": 1})
    (message,) = errors["resources"]["gpus"]
    assert "holds no quota on A100-40GB" in message


def test_gang_over_the_teams_limit_is_refused_on_replicas(org: Org) -> None:
    # team-alpha's H100 limit is 32; 5 x 8 = 40 (no node known: only quotas judge)
    errors = refused(org, replicas=5, resources={"gpus": 8})
    assert (
        "team-alpha may use at most 32 H100-80GB (its limit); the job needs 40"
        in (errors["replicas"][0])
    )


def test_an_ancestors_limit_refuses_too(org: Org) -> None:
    Quota.objects.filter(tenant=org.research).update(limit_milli=32_000, guaranteed_milli=32_000)
    Quota.objects.filter(tenant=org.alpha).update(limit_milli=48_000, guaranteed_milli=16_000)
    errors = refused(org, replicas=5, resources={"gpus": 8})
    assert "research may use at most 32 H100-80GB" in errors["replicas"][0]


def test_per_user_cap_refuses(org: Org) -> None:
    Quota.objects.filter(tenant=org.alpha).update(user_limit_milli=4000)
    errors = refused(org, replicas=1, resources={"gpus": 8})
    assert "one user of team-alpha may hold at most 4 H100-80GB" in (errors["resources"]["gpus"][0])


def test_a_job_one_allowed_flavor_can_hold_is_accepted(org: Org, inventory: None) -> None:
    # 60000 MiB: no A100-40GB device, but an H100-80GB one
    job, created = job_submit(
        user=org.users["alice"],
        project=org.proj_alpha,
        payload=job_spec(
            replicas=1,
            flavors=["A100-40GB", "H100-80GB"],
            resources={"gpu_milli": 500, "gpu_memory_mib": 60000},
        ),
    )
    assert created and job.state == "queued"


def test_best_effort_is_not_judged_by_quota(org: Org, inventory: None) -> None:
    _, created = job_submit(
        user=org.users["alice"],
        project=org.proj_alpha,
        payload=job_spec(
            replicas=1, flavors=["A100-40GB"], priority_class="best-effort", resources={"gpus": 1}
        ),
    )
    assert created


def test_where_the_inventory_may_grow_a_job_beyond_it_is_queued(
    org: Org, inventory: None, settings: Any
) -> None:
    settings.GANTRY_REFUSE_BEYOND_INVENTORY = False
    job, created = job_submit(
        user=org.users["alice"],
        project=org.proj_alpha,
        payload=job_spec(replicas=1, resources={"gpus": 16}),
    )
    assert created and job.state == "queued"
    # quotas still refuse
    errors = refused_after(org, replicas=5, resources={"gpus": 8})
    assert "its limit" in errors["replicas"][0]


def refused_after(org: Org, **spec: Any) -> dict[str, Any]:
    before = Job.objects.count()
    with pytest.raises(ValidationError) as info:
        job_submit(user=org.users["alice"], project=org.proj_alpha, payload=job_spec(**spec))
    assert Job.objects.count() == before
    detail: dict[str, Any] = info.value.detail  # type: ignore[assignment]
    return detail


def test_portal_form_shows_the_refusal_on_the_field(org: Org, inventory: None) -> None:
    from django.test import Client

    client = Client()
    client.force_login(org.users["alice"])
    form = {
        "project": org.proj_alpha.pk,
        "job_type": "training",
        "name": "too-wide",
        "image": "pytorch/pytorch:2.4",
        "command": "python train.py",
        "replicas": 1,
        "gpus": 16,
        "cpu_milli": 1000,
        "memory_mib": 1024,
        "retry_limit": 0,
        "idempotency_key": "k1",
    }
    response = client.post("/jobs/new/", form)
    assert response.status_code == 400
    assert response.context["form"].errors["gpus"] == [
        "no node in the cluster can hold this job: no A100-40GB or H100-80GB node has 16 GPUs; "
        "the most on one node is 8."
    ]


def test_with_no_node_known_the_inventory_is_not_judged(org: Org) -> None:
    _, created = job_submit(
        user=org.users["alice"],
        project=org.proj_alpha,
        payload=job_spec(replicas=1, resources={"gpus": 16}),
    )
    assert created


def test_api_answers_400_naming_the_field(org: Org, inventory: None, client_for: Any) -> None:
    body = {
        "project": org.proj_alpha.pk,
        "spec": job_spec(replicas=1, flavors=[], resources={"gpus": 16}),
    }
    response = client_for("alice").post(JOBS, body, format="json")
    assert response.status_code == 400, response.json()
    (message,) = response.json()["errors"]["spec"]["resources"]["gpus"]
    assert "no A100-40GB or H100-80GB node has 16 GPUs; the most on one node is 8" in message
    assert Job.objects.count() == 0


def test_a_job_without_gpus_beyond_a_gpu_nodes_cpu_only_share_is_refused(
    org: Org, inventory: None
) -> None:
    # Issue 34, item 17: jobs without GPUs hold at most 1/8 of a GPU node's CPU and memory
    # (the default profile): 8 of the 64 cores here, so 40 cores can never run.
    errors = refused(
        org, replicas=1, flavors=[], resources={"gpus": 0, "cpu_milli": 40_000, "memory_mib": 1024}
    )
    (message,) = errors["resources"]["cpu_milli"]
    assert "node has 40000 mCPU for jobs without GPUs (the rest is kept for GPU jobs)" in message
    assert "the most is 8000" in message


def test_the_cpu_only_share_is_the_leading_daemons_profile(org: Org, inventory: None) -> None:
    # the daemon recorded a profile that lets jobs without GPUs take half a GPU node
    document = Profile.from_dict({"placement": {"cpu_only_share": 0.5}}).to_document()
    SchedulingProfileRecord.objects.create(
        name="half", sha256="0" * 64, document=document, loaded_at=timezone.now()
    )
    errors = refused(org, replicas=1, flavors=[], resources={"gpus": 0, "cpu_milli": 32_001})
    assert "the most is 32000" in errors["resources"]["cpu_milli"][0]
    spec = job_spec(replicas=1, flavors=[], resources={"gpus": 0, "cpu_milli": 32_000})
    job, _ = job_submit(user=org.users["alice"], project=org.proj_alpha, payload=spec)
    assert job.state == "queued"
