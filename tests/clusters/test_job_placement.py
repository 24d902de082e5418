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
