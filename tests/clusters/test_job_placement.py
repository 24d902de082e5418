"""A job's `placement` (required clusters and regions, preferred clusters): validated at
submit with what was wrong, carried to the engine by the snapshot."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.jobs.spec import spec_errors
from scheduler.models import Cluster, Job
from scheduler.snapshot.rows import ROW_FIELDS
from scheduler.snapshot.translate import job_request
from tenants.models import PriorityClass
from tests.conftest import job_spec

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("placement", "field", "words"),
    [
        ({"clusters": ["nowhere"]}, "clusters", "unknown cluster 'nowhere'; known clusters: local"),
        ({"preferred_clusters": ["nowhere"]}, "preferred_clusters", "unknown cluster"),
        ({"regions": ["EU West"]}, "regions", "not a valid region name"),
        ({"zones": ["a"]}, "zones", ""),
    ],
    ids=["unknown-cluster", "unknown-preferred", "bad-region", "unknown-key"],
)
def test_a_bad_placement_is_refused_naming_what_was_wrong(
    org: Any, placement: dict[str, Any], field: str, words: str
) -> None:
    errors = spec_errors(job_spec(placement=placement))
    assert field in errors["placement"]
    assert words in str(errors["placement"][field])


def test_the_engine_gets_the_jobs_placement(org: Any, client_for: Any) -> None:
    Cluster.objects.create(name="site-b", backend="simulated")
    placement = {
        "clusters": ["site-b", "local"],
        "regions": ["eu"],
        "preferred_clusters": ["site-b"],
    }
    body = {"project": org.proj_alpha.pk, "spec": job_spec(placement=placement, replicas=1)}
    answer = client_for("alice").post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 201, answer.json()
    row = Job.objects.filter(pk=answer.json()["id"]).values(*ROW_FIELDS)[0]
    classes = {pc["id"]: pc for pc in PriorityClass.objects.values("id", "name")}
    request = job_request(row, {}, classes)
    assert (request.clusters, request.regions, request.preferred_clusters) == (
        ("site-b", "local"),
        ("eu",),
        ("site-b",),
    )


def test_a_job_without_placement_keeps_its_spec_as_before(org: Any) -> None:
    assert "placement" not in spec_errors(job_spec())
    from scheduler.jobs.spec import JobSpecSerializer

    serializer = JobSpecSerializer(data=job_spec())
    assert serializer.is_valid(), serializer.errors
    assert "placement" not in serializer.validated_data


def _two_clusters() -> None:
    from scheduler.backends.base import GpuInfo, NodeInfo
    from scheduler.nodes.services import node_sync

    Cluster.objects.create(name="site-b", backend="simulated", labels={"region": "eu"})
    gpus = tuple(GpuInfo(i, 81920) for i in range(8))
    b = {"gantry.io/cluster": "site-b", "gantry.io/region": "eu"}
    node_sync(
        [
            NodeInfo(
                "h1", "H100-80GB", gpus, 64_000, 1 << 20, labels={"gantry.io/cluster": "local"}
            ),
            NodeInfo("site-b:n1", "H100-80GB", gpus, 64_000, 1 << 20, labels=b),
        ]
    )


def test_a_gang_no_one_cluster_could_hold_is_refused_at_submit_saying_why(
    org: Any, client_for: Any
) -> None:
    _two_clusters()
    spec = job_spec(replicas=2, resources={"gpus": 8})  # 16 GPUs; each cluster has 8
    answer = client_for("alice").post(
        "/api/v1/jobs/", {"project": org.proj_alpha.pk, "spec": spec}, format="json"
    )
    assert answer.status_code == 400, answer.json()
    assert "any one cluster hold at most 1 of the 2 replicas" in str(answer.json()["errors"])
    assert not Job.objects.exists()
    one = job_spec(replicas=1, resources={"gpus": 8})
    assert (
        client_for("alice")
        .post("/api/v1/jobs/", {"project": org.proj_alpha.pk, "spec": one}, format="json")
        .status_code
        == 201
    )


def test_a_job_whose_required_region_holds_no_such_node_is_refused(
    org: Any, client_for: Any
) -> None:
    _two_clusters()
    body = {
        "project": org.proj_alpha.pk,
        "spec": job_spec(replicas=1, placement={"regions": ["us"]}),
    }
    answer = client_for("alice").post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 400, answer.json()
    body["spec"]["placement"] = {"regions": ["eu"]}
    assert client_for("alice").post("/api/v1/jobs/", body, format="json").status_code == 201
