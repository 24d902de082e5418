"""Parent and children pinned to one cluster (issue 38): a child's pinned guarantee on a
cluster fits what its parent holds there (the parent's pin on it, else the parent's global
guarantee), the children's pinned guarantees there sum within it, and a parent's pin (or its
global guarantee, where it pins nothing) is not lowered below its children's, naming them.

The org fixture's H100 quotas (GPUs guaranteed / limit): research 32/64 with its children
team-alpha 16/32 and team-bravo 16/32. Writes go through `quota_set` as pat, the platform
admin, or through `POST /api/v1/quotas/`.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from scheduler.models import Cluster
from tenants import services
from tenants.models import AuditEntry, Quota
from tenants.quotas.rules import QuotaValues
from tests.conftest import Org


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def site_b(db: Any) -> Cluster:
    return Cluster.objects.create(name="site-b", backend="simulated")


def values(guaranteed: float, limit: float) -> QuotaValues:
    return QuotaValues(round(guaranteed * 1000), round(limit * 1000), None, 1.0)


def pin(org: Org, tenant: str, cluster: Cluster | None, guaranteed: float, limit: float) -> Quota:
    return services.quota_set(
        user=org.users["pat"],
        tenant=getattr(org, tenant),
        flavor=org.h100,
        values=values(guaranteed, limit),
        cluster=cluster,
    )


def rows() -> list[tuple[Any, ...]]:
    return list(
        Quota.objects.order_by("tenant__slug", "flavor__name", "cluster__name").values_list(
            "tenant__slug", "cluster__name", "guaranteed_milli", "limit_milli"
        )
    )


def refused(call: Any) -> dict[str, list[str]]:
    """The errors of a refused change, after checking that it changed nothing."""
    before, audited = rows(), AuditEntry.objects.count()
    with pytest.raises(ValidationError) as caught:
        call()
    assert rows() == before and AuditEntry.objects.count() == audited
    return caught.value.message_dict


def test_childrens_pins_sum_within_the_parents_pin_on_that_cluster(
    org: Org, site_b: Cluster
) -> None:
    pin(org, "research", site_b, 10, 20)
    pin(org, "alpha", site_b, 8, 20)
    # 8 + 4 = 12 > research's 10 on site-b, though each fits its own global 16
    errors = refused(lambda: pin(org, "bravo", site_b, 4, 20))
    assert errors["guaranteed_milli"] == [
        "the guarantees of the children of 'research' pinned to cluster site-b for H100-80GB "
        "would sum to 12 GPUs (team-bravo 4 GPUs + team-alpha 8 GPUs), above what 'research' "
        "holds on site-b: its pinned guarantee there of 10 GPUs."
    ]
    pin(org, "bravo", site_b, 2, 20)  # 8 + 2 = 10: within
    assert Quota.objects.filter(cluster=site_b).count() == 3


def test_a_childs_pin_fits_the_parents_global_guarantee_where_the_parent_pins_none(
    org: Org, site_b: Cluster
) -> None:
    """Children holding pins only (no global quota) are each checked against research's global
    quota alone; on site-b together they would hold more than research has anywhere."""
    Quota.objects.filter(tenant__in=[org.alpha, org.bravo]).delete()
    pin(org, "alpha", site_b, 20, 20)
    # 20 + 16 = 36 > research's global 32, and research pins nothing on site-b
    errors = refused(lambda: pin(org, "bravo", site_b, 16, 16))
    assert (
        "above what 'research' holds on site-b: its global guarantee of 32 GPUs (it pins "
        "none there)." in errors["guaranteed_milli"][0]
    )
    pin(org, "bravo", site_b, 12, 16)
    assert Quota.objects.filter(cluster=site_b).count() == 2


def test_lowering_a_parents_pin_below_its_childrens_is_refused_naming_them(
    org: Org, site_b: Cluster
) -> None:
    pin(org, "research", site_b, 20, 40)
    pin(org, "alpha", site_b, 8, 16)
    pin(org, "bravo", site_b, 8, 30)
    errors = refused(lambda: pin(org, "research", site_b, 12, 20))
    assert errors == {
        "guaranteed_milli": [
            "guaranteed (12 GPUs) is below what the children of 'research' are guaranteed on "
            "cluster site-b for H100-80GB: 16 GPUs (team-alpha 8 GPUs + team-bravo 8 GPUs)."
        ],
        "limit_milli": [
            "limit (20 GPUs) is below the limits the children of 'research' pin on cluster "
            "site-b for H100-80GB: team-bravo 30 GPUs."
        ],
    }
    pin(org, "research", site_b, 16, 30)  # down to exactly what the children hold: kept
    assert Quota.objects.get(tenant=org.research, cluster=site_b).guaranteed_milli == 16000


def test_lowering_a_parents_global_guarantee_below_its_childrens_pins_is_refused(
    org: Org, site_b: Cluster
) -> None:
    """Where the parent pins nothing on a cluster, its global guarantee is what it holds
    there; the children's global quotas are gone, so only their pins hold it up."""
    Quota.objects.filter(tenant__in=[org.alpha, org.bravo]).delete()
    pin(org, "alpha", site_b, 12, 12)
    pin(org, "bravo", site_b, 12, 12)
    errors = refused(lambda: pin(org, "research", None, 20, 64))
    assert errors["guaranteed_milli"] == [
        "guaranteed (20 GPUs) is below what the children of 'research' pin on cluster site-b "
        "for H100-80GB, where 'research' pins nothing: 24 GPUs (team-alpha 12 GPUs + "
        "team-bravo 12 GPUs)."
    ]
    pin(org, "research", site_b, 24, 64)  # once research pins site-b, its pin holds them
    pin(org, "research", None, 24, 64)
    assert Quota.objects.get(tenant=org.research, cluster__isnull=True).guaranteed_milli == 24000


def test_the_api_refuses_a_parents_pin_below_its_childrens_with_a_400(
    org: Org, site_b: Cluster, client_for: Any
) -> None:
    pin(org, "research", site_b, 20, 40)
    pin(org, "alpha", site_b, 8, 16)
    before = rows()
    body = {
        "tenant": org.research.pk,
        "flavor": org.h100.pk,
        "cluster": site_b.pk,
        "guaranteed_milli": 4000,
        "limit_milli": 40000,
    }
    response = client_for("pat").post("/api/v1/quotas/", body, format="json")
    assert response.status_code == 400
    assert "team-alpha 8 GPUs" in " ".join(response.json()["errors"]["guaranteed_milli"])
    assert rows() == before
