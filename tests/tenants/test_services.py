"""Tenant services: who may set quotas and defaults, and what the other writes keep true.

Personas (tests/conftest.py): alice member and tina admin of team-alpha, bob-bravo member of
team-bravo, dana admin of the research department (team-alpha and team-bravo), chris member of
team-charlie under product, carol finance, pat platform admin.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from tenants import services
from tenants.models import PriorityClass, PriorityDefault, Quota, Tenant
from tenants.quotas.rules import QuotaValues
from tests.conftest import Org


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    # The org fixture hashes a password per persona; the production hasher dominates runtime.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# 12 of 16 GPUs: a lowering that every tree rule allows, so only permission decides.
SMALLER = QuotaValues(guaranteed_milli=12000, limit_milli=16000, lend_limit_milli=None, weight=1)


def quota_row(tenant: Tenant, org: Org) -> tuple[int, int]:
    row = Quota.objects.get(tenant=tenant, flavor=org.h100)
    return row.guaranteed_milli, row.limit_milli


QUOTA_PERMISSIONS = [
    # (user, tenant, allowed): quotas are set from above, never by the tenant's own admins
    pytest.param("tina", "alpha", False, id="team-admin-own-team"),
    pytest.param("dana", "alpha", True, id="dept-admin-child-team"),
    pytest.param("dana", "bravo", True, id="dept-admin-other-child-team"),
    pytest.param("dana", "research", False, id="dept-admin-own-department"),
    pytest.param("dana", "charlie", False, id="dept-admin-other-department"),
    pytest.param("alice", "alpha", False, id="member-own-team"),
    pytest.param("bob-bravo", "alpha", False, id="member-other-team"),
    pytest.param("carol", "alpha", False, id="finance"),
    pytest.param("pat", "alpha", True, id="platform-admin-team"),
    pytest.param("pat", "research", True, id="platform-admin-department"),
]


@pytest.mark.parametrize(("username", "tenant", "allowed"), QUOTA_PERMISSIONS)
def test_who_may_set_a_quota(org: Org, username: str, tenant: str, allowed: bool) -> None:
    target: Tenant = getattr(org, tenant)
    values = SMALLER
    if tenant == "research":  # keep its children's 16 + 16 = 32 inside
        values = QuotaValues(
            guaranteed_milli=32000, limit_milli=48000, lend_limit_milli=None, weight=1
        )
    before = quota_row(target, org)
    if allowed:
        services.quota_set(user=org.users[username], tenant=target, flavor=org.h100, values=values)
        assert quota_row(target, org) == (values.guaranteed_milli, values.limit_milli)
    else:
        with pytest.raises(PermissionDenied, match=f"Quotas of '{target.slug}'"):
            services.quota_set(
                user=org.users[username], tenant=target, flavor=org.h100, values=values
            )
        assert quota_row(target, org) == before


def test_only_platform_admins_set_the_root_quota(org: Org) -> None:
    values = QuotaValues(guaranteed_milli=96000, limit_milli=96000, lend_limit_milli=None, weight=1)
    for username in ["dana", "tina", "carol"]:
        with pytest.raises(PermissionDenied):
            services.quota_set(
                user=org.users[username], tenant=org.acme, flavor=org.h100, values=values
            )
    services.quota_set(user=org.users["pat"], tenant=org.acme, flavor=org.h100, values=values)
    assert quota_row(org.acme, org) == (96000, 96000)


def test_permission_is_checked_before_the_rules(org: Org) -> None:
    # An invalid value from someone without the right is a 403, not a hint about the tree.
    bad = QuotaValues(guaranteed_milli=99000, limit_milli=1000, lend_limit_milli=None, weight=1)
    with pytest.raises(PermissionDenied):
        services.quota_set(user=org.users["tina"], tenant=org.alpha, flavor=org.h100, values=bad)


def test_quota_delete_refused_while_children_hold_guarantees(org: Org) -> None:
    research = Quota.objects.get(tenant=org.research, flavor=org.h100)
    with pytest.raises(
        ValidationError, match="'research' still gives H100-80GB quota to its children"
    ):
        services.quota_delete(user=org.users["pat"], quota=research)
    assert Quota.objects.filter(pk=research.pk).exists()
    alpha = Quota.objects.get(tenant=org.alpha, flavor=org.h100)
    with pytest.raises(PermissionDenied):
        services.quota_delete(user=org.users["tina"], quota=alpha)
    services.quota_delete(user=org.users["dana"], quota=alpha)  # a leaf, from above
    assert not Quota.objects.filter(pk=alpha.pk).exists()


def test_tenant_create_materialises_the_path(org: Org) -> None:
    squad = services.tenant_create(
        user=org.users["tina"], parent=org.alpha, slug="squad-one", name="Squad One", kind="group"
    )
    assert squad.path == f"{org.alpha.path}{squad.pk}/"
    assert squad.depth == org.alpha.depth + 1 == 3  # acme 0, research 1, team-alpha 2
    assert squad.ancestor_ids() == [org.acme.pk, org.research.pk, org.alpha.pk, squad.pk]


@pytest.mark.parametrize(
    ("username", "parent", "slug", "error"),
    [
        pytest.param("alice", "alpha", "squad", PermissionDenied, id="member"),
        pytest.param("tina", "bravo", "squad", PermissionDenied, id="admin-of-a-sibling"),
        pytest.param("dana", None, "new-root", PermissionDenied, id="dept-admin-root"),
        pytest.param("tina", "alpha", "Squad_One", ValidationError, id="bad-slug"),
        pytest.param("tina", "alpha", "team-bravo", ValidationError, id="duplicate-slug"),
    ],
)
def test_tenant_create_refused(
    org: Org, username: str, parent: str | None, slug: str, error: type[Exception]
) -> None:
    count = Tenant.objects.count()
    with pytest.raises(error):
        services.tenant_create(
            user=org.users[username],
            parent=getattr(org, parent) if parent else None,
            slug=slug,
            name="Squad",
            kind="group",
        )
    assert Tenant.objects.count() == count


@pytest.mark.parametrize(
    ("username", "tenant", "allowed"),
    [
        pytest.param("tina", "alpha", True, id="team-admin-own-team"),
        pytest.param("dana", "alpha", True, id="dept-admin-child-team"),
        pytest.param("alice", "alpha", False, id="member"),
        pytest.param("tina", "research", False, id="team-admin-parent"),
        pytest.param("carol", "alpha", False, id="finance"),
        pytest.param("dana", None, False, id="dept-admin-platform-wide"),
        pytest.param("pat", None, True, id="platform-admin-platform-wide"),
    ],
)
def test_who_may_set_a_priority_default(
    org: Org, username: str, tenant: str | None, allowed: bool
) -> None:
    target = getattr(org, tenant) if tenant else None
    critical = PriorityClass.objects.get(name="critical")

    def current() -> str | None:
        row = PriorityDefault.objects.filter(tenant=target, job_type="training").first()
        return row.priority_class.name if row else None

    before = current()
    if allowed:
        services.priority_default_set(
            user=org.users[username], tenant=target, job_type="training", priority_class=critical
        )
        assert current() == "critical"
    else:
        with pytest.raises(PermissionDenied):
            services.priority_default_set(
                user=org.users[username],
                tenant=target,
                job_type="training",
                priority_class=critical,
            )
        assert current() == before


def test_priority_default_set_twice_updates_one_row(org: Org) -> None:
    for name in ["high", "low"]:
        services.priority_default_set(
            user=org.users["tina"],
            tenant=org.alpha,
            job_type="batch",
            priority_class=PriorityClass.objects.get(name=name),
        )
    rows = PriorityDefault.objects.filter(tenant=org.alpha, job_type="batch")
    assert [r.priority_class.name for r in rows] == ["low"]


def test_priority_default_for_walks_to_the_nearest_ancestor(org: Org) -> None:
    high = PriorityClass.objects.get(name="high")
    services.priority_default_set(
        user=org.users["pat"], tenant=org.acme, job_type="training", priority_class=high
    )
    # acme's row covers every team; product has none of its own
    assert services.priority_default_for(tenant=org.charlie, job_type="training") == high
    assert services.priority_default_for(tenant=org.charlie, job_type="batch").name == "low"
