"""A quota pinned to a cluster, from the database to the engine's decision (issue 38): the
snapshot carries the pin, and the cycle keeps the tenant within it."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core import Profile, run_cycle
from scheduler.models import Cluster
from scheduler.snapshot.build import build_snapshot
from tenants import services
from tenants.quotas.rules import QuotaValues
from tests.clusters.test_job_placement import _two_clusters
from tests.conftest import job_spec

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("pinned_to", "lands_on"),
    [(None, "h1"), ("local", "site-b:n1")],
    ids=["no-pin-best-fit-first-node", "pinned-limit-0-on-local"],
)
def test_a_pinned_limit_keeps_the_team_off_that_cluster(
    org: Any, client_for: Any, pinned_to: str | None, lands_on: str
) -> None:
    _two_clusters()
    if pinned_to is not None:
        services.quota_set(
            user=org.users["pat"],
            tenant=org.alpha,
            flavor=org.h100,
            values=QuotaValues(0, 0, None, 1.0),
            cluster=Cluster.objects.get(name=pinned_to),
        )
    body = {"project": org.proj_alpha.pk, "spec": job_spec(replicas=1, resources={"gpus": 4})}
    answer = client_for("alice").post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 201, answer.json()
    snapshot = build_snapshot(1000.0, decayed={}).snapshot
    result = run_cycle(snapshot, Profile())
    placement = result.placement_for(str(answer.json()["id"]))
    assert placement is not None, result.reason_for(str(answer.json()["id"]))
    assert [a.node for a in placement.assignments] == [lands_on]
