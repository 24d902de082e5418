"""Portal fixtures: browser-like clients per persona and a world with one of every object per team.

`world` gives each of team-alpha, team-bravo and team-charlie a job that waits for approval
(with its approval request), a queued job, an approval policy, a priority default and audit
entries, all made through the services so the rows look like real ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from django.core.cache import cache
from django.test import Client

from scheduler.jobs.services import job_submit
from scheduler.models import Job
from tenants import approval_policies, services
from tenants.models import ApprovalPolicy, ApprovalRequest, Membership, Tenant
from tests import factories as f
from tests.conftest import Org, job_spec


@dataclass
class TeamObjects:
    tenant: Tenant
    queued: Job
    pending: Job
    request: ApprovalRequest
    policy: ApprovalPolicy
    membership: Membership


@dataclass
class World:
    org: Org
    teams: dict[str, TeamObjects] = field(default_factory=dict)


@pytest.fixture(autouse=True)
def _clear_cache() -> None:
    """The login guard counts failures in the cache; every test starts from zero."""
    cache.clear()


@pytest.fixture
def web_for(org: Org) -> Callable[[str], Client]:
    """web_for("alice") -> a Django test client logged in as that persona."""

    def make(username: str) -> Client:
        client = Client()
        client.force_login(org.users[username])
        return client

    return make


def build_world(org: Org) -> World:
    world = World(org=org)
    admin = org.users["pat"]
    for key, tenant, project, member in [
        ("alpha", org.alpha, org.proj_alpha, org.users["alice"]),
        ("bravo", org.bravo, org.proj_bravo, org.users["bob-bravo"]),
        ("charlie", org.charlie, org.proj_charlie, org.users["chris"]),
    ]:
        policy = approval_policies.policy_set(
            user=admin,
            tenant=tenant,
            rule="gpus_over",
            threshold=8,
            description=f"big jobs of {tenant.slug}",
        )
        queued, _ = job_submit(
            user=member,
            project=project,
            payload=job_spec(
                name=f"small-{tenant.slug}",
                replicas=1,
                resources={"gpus": 1, "cpu_milli": 1000, "memory_mib": 1024},
            ),
        )
        pending, _ = job_submit(
            user=member, project=project, payload=job_spec(name=f"big-{tenant.slug}", replicas=4)
        )
        services.priority_default_set(
            user=admin, tenant=tenant, job_type="batch", priority_class=f.priority("low")
        )
        world.teams[key] = TeamObjects(
            tenant=tenant,
            queued=queued,
            pending=pending,
            request=ApprovalRequest.objects.get(subject_id=pending.pk, kind="job"),
            policy=policy,
            membership=Membership.objects.get(user=member, tenant=tenant),
        )
    return world


@pytest.fixture
def world(org: Org) -> World:
    return build_world(org)
