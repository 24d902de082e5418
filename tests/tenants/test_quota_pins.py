"""Quotas pinned to a cluster (issue 38): how they combine with the global tree
(`tenants.quotas.pins`), the database's uniqueness with null clusters, the API, the audit log,
and what the engine is given (`scheduler.snapshot.translate.load_tenants`).

The org fixture's H100 quotas (GPUs guaranteed / limit): acme 64/64, research 32/64,
team-alpha 16/32, team-bravo 16/32, product 32/64, team-charlie 16/32. Writes go through
`quota_set` as pat, the platform admin.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from scheduler.core.quota import pinned_key
from scheduler.core.types import Quota as CoreQuota
from scheduler.models import Cluster
from scheduler.snapshot.translate import load_tenants
from tenants import services
from tenants.models import AuditEntry, Quota
from tenants.quotas.rules import QuotaValues
from tests import factories as f
from tests.conftest import Org


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def site_b(db: Any) -> Cluster:
    return Cluster.objects.create(name="site-b", backend="simulated")


@pytest.fixture
def site_c(db: Any) -> Cluster:
    return Cluster.objects.create(name="site-c", backend="simulated")


def values(guaranteed: float, limit: float, **extra: Any) -> QuotaValues:
    return QuotaValues(round(guaranteed * 1000), round(limit * 1000), None, 1.0, **extra)


def pin(org: Org, tenant: str, cluster: Cluster, guaranteed: float, limit: float) -> Quota:
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


def test_pinned_quotas_beside_the_global_one_are_saved(
    org: Org, site_b: Cluster, site_c: Cluster
) -> None:
    # alpha 16/32 globally: 8 + 8 = 16 of it pinned, limits within 32
    pin(org, "alpha", site_b, 8, 32)
    pin(org, "alpha", site_c, 8, 12)
    pin(org, "alpha", site_c, 6, 10)  # the same pin again: updated, not a second row
    pinned = Quota.objects.filter(tenant=org.alpha, cluster__isnull=False)
    assert sorted(pinned.values_list("cluster__name", "guaranteed_milli", "limit_milli")) == [
        ("site-b", 8000, 32000),
        ("site-c", 6000, 10000),
    ]
    assert Quota.objects.get(tenant=org.alpha, cluster__isnull=True).guaranteed_milli == 16000


@pytest.mark.parametrize(
    ("first", "then", "field", "message"),
    [
        # 10 + 8 = 18 > alpha's global 16
        ((10, 32), (8, 32), "guaranteed_milli", "would sum to 18 GPUs, above its global"),
        (None, (4, 40), "limit_milli", "exceeds its global limit for H100-80GB (32 GPUs)"),
        (None, (8, 4), "limit_milli", "is below its guaranteed"),
    ],
    ids=["pinned-guarantees-above-the-global-one", "limit-above-global", "limit-below-own"],
)
def test_contradictory_pins_are_refused_and_change_nothing(
    org: Org,
    site_b: Cluster,
    site_c: Cluster,
    first: tuple[float, float] | None,
    then: tuple[float, float],
    field: str,
    message: str,
) -> None:
    if first is not None:
        pin(org, "alpha", site_b, *first)
    before = rows()
    with pytest.raises(ValidationError) as caught:
        pin(org, "alpha", site_c, *then)
    assert message in " ".join(caught.value.message_dict[field])
    assert rows() == before


def test_a_global_quota_cannot_drop_below_its_pins(org: Org, site_b: Cluster) -> None:
    pin(org, "alpha", site_b, 12, 30)
    before = rows()
    with pytest.raises(ValidationError) as caught:
        services.quota_set(
            user=org.users["pat"], tenant=org.alpha, flavor=org.h100, values=values(8, 16)
        )
    errors = caught.value.message_dict
    assert (
        "below the guarantees of 'team-alpha' pinned to clusters" in errors["guaranteed_milli"][0]
    )
    assert "site-b 30 GPUs" in errors["limit_milli"][0]
    assert rows() == before


def test_a_pin_without_a_global_quota_counts_its_sums_against_the_parent(
    org: Org, site_b: Cluster
) -> None:
    Quota.objects.filter(tenant=org.alpha).delete()
    # research guarantees 32 and bravo takes 16: alpha's pinned 20 would sum to 36
    with pytest.raises(ValidationError) as caught:
        pin(org, "alpha", site_b, 20, 20)
    assert "holds the sum of its pinned ones" in caught.value.message_dict["guaranteed_milli"][0]
    pin(org, "alpha", site_b, 16, 20)
    assert Quota.objects.filter(tenant=org.alpha).count() == 1


def test_a_pin_takes_no_lending_user_limit_or_weight(org: Org, site_b: Cluster) -> None:
    with pytest.raises(ValidationError) as caught:
        services.quota_set(
            user=org.users["pat"],
            tenant=org.alpha,
            flavor=org.h100,
            values=QuotaValues(4000, 8000, 2000, 2.0, 1000),
            cluster=site_b,
        )
    assert set(caught.value.message_dict) == {"lend_limit_milli", "user_limit_milli", "weight"}


def test_a_pinned_limit_is_within_the_parents_pin_on_that_cluster(
    org: Org, site_b: Cluster
) -> None:
    pin(org, "research", site_b, 8, 10)
    with pytest.raises(ValidationError) as caught:
        pin(org, "alpha", site_b, 4, 12)
    assert (
        "the parent 'research''s limit there (10 GPUs)"
        in caught.value.message_dict["limit_milli"][0]
    )


def test_the_database_keeps_one_global_and_one_pin_per_cluster(org: Org, site_b: Cluster) -> None:
    """A unique index with a null column lets any number of nulls through on PostgreSQL and
    SQLite alike: the global row has its own partial index."""
    pin(org, "alpha", site_b, 4, 8)
    for cluster in (None, site_b):
        with pytest.raises(IntegrityError), transaction.atomic():
            f.QuotaFactory(
                tenant=org.alpha,
                flavor=org.h100,
                cluster=cluster,
                guaranteed_milli=0,
                limit_milli=0,
            )
    assert Quota.objects.filter(tenant=org.alpha, flavor=org.h100).count() == 2


def test_siblings_pins_do_not_count_as_global_guarantees(org: Org, site_b: Cluster) -> None:
    """The tree's checks (and the database's trigger on PostgreSQL) sum the global rows: 16
    pinned by each team is not 32 + 32 of research's 32."""
    pin(org, "alpha", site_b, 16, 32)
    pin(org, "bravo", site_b, 16, 32)
    services.quota_set(
        user=org.users["pat"], tenant=org.research, flavor=org.h100, values=values(32, 64)
    )
    assert Quota.objects.filter(tenant__parent=org.research, cluster__isnull=True).count() == 2


def test_setting_and_removing_a_pin_is_audited(org: Org, site_b: Cluster) -> None:
    quota = pin(org, "alpha", site_b, 4, 8)
    services.quota_delete(user=org.users["pat"], quota=quota)
    entries = AuditEntry.objects.filter(action__in=["quota.set", "quota.delete"]).order_by("pk")
    (made, gone) = list(entries)[-2:]
    assert made.action == "quota.set" and made.after["cluster"] == site_b.pk
    assert gone.action == "quota.delete" and gone.before["cluster"] == site_b.pk


def test_the_engine_gets_pinned_quotas_under_their_own_keys(org: Org, site_b: Cluster) -> None:
    pin(org, "alpha", site_b, 4, 8)
    tenants, _ = load_tenants()
    alpha = next(t for t in tenants if t.name == "team-alpha")
    assert alpha.quotas["H100-80GB"] == CoreQuota(16000, 32000, None)
    assert dict(alpha.pinned) == {pinned_key("H100-80GB", "site-b"): CoreQuota(4000, 8000)}


# -- the API ----------------------------------------------------------------------------------


def test_the_quotas_endpoint_takes_and_shows_the_cluster(
    org: Org, site_b: Cluster, client_for: Any
) -> None:
    client = client_for("pat")
    body = {
        "tenant": org.alpha.pk,
        "flavor": org.h100.pk,
        "cluster": site_b.pk,
        "guaranteed_milli": 4000,
        "limit_milli": 8000,
    }
    made = client.post("/api/v1/quotas/", body, format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["cluster"] == site_b.pk and made.json()["cluster_name"] == "site-b"
    patched = client.patch(
        f"/api/v1/quotas/{made.json()['id']}/", {"limit_milli": 10000}, format="json"
    )
    assert patched.status_code == 200 and patched.json()["cluster_name"] == "site-b"
    listed = client.get("/api/v1/quotas/", {"tenant": org.alpha.pk, "pinned": "true"}).json()
    assert [(q["cluster_name"], q["limit_milli"]) for q in listed["results"]] == [("site-b", 10000)]
    globals_ = client.get("/api/v1/quotas/", {"tenant": org.alpha.pk, "pinned": "false"}).json()
    assert [q["cluster"] for q in globals_["results"]] == [None]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cluster": 999999}, "cluster"),
        ({"guaranteed_milli": 20000, "limit_milli": 20000}, "guaranteed_milli"),
        ({"lend_limit_milli": 1000}, "lend_limit_milli"),
    ],
    ids=["unknown-cluster", "above-the-global-guarantee", "lending-on-a-pin"],
)
def test_a_bad_pin_is_a_400_naming_the_field_and_changes_nothing(
    org: Org, site_b: Cluster, client_for: Any, change: dict[str, Any], field: str
) -> None:
    before = rows()
    body = {
        "tenant": org.alpha.pk,
        "flavor": org.h100.pk,
        "cluster": site_b.pk,
        "guaranteed_milli": 4000,
        "limit_milli": 8000,
        **change,
    }
    response = client_for("pat").post("/api/v1/quotas/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert rows() == before


# -- what people see ---------------------------------------------------------------------------


def test_a_pinned_row_shows_the_use_on_its_cluster_only(org: Org, site_b: Cluster) -> None:
    from django.test import Client
    from django.urls import reverse

    from scheduler.models import JobState
    from scheduler.snapshot.quota_usage import quota_rows

    home = Cluster.objects.get(home=True)
    pin(org, "alpha", site_b, 4, 8)
    pin(org, "alpha", home, 4, 8)
    on_b = f.NodeFactory(name="site-b:n1", cluster=site_b)
    unlabelled = f.NodeFactory(cluster=None)  # a node without a cluster is home's

    def running(gpus: int, node: Any) -> None:
        job = f.JobFactory(
            project=org.proj_alpha,
            state=JobState.RUNNING,
            replicas=1,
            gpu_milli_per_replica=gpus * 1000,
            flavors=["H100-80GB"],
        )
        f.place(job, node)

    running(3, on_b)
    running(2, unlabelled)
    rows = {(r.tenant.slug, r.cluster): r.used_milli for r in quota_rows([org.alpha, org.research])}
    # global: 3 + 2; on site-b: 3; on the home cluster: 2; research pins nothing
    assert rows == {
        ("team-alpha", ""): 5000,
        ("team-alpha", "site-b"): 3000,
        ("team-alpha", home.name): 2000,
        ("research", ""): 5000,
    }
    web = Client()
    web.force_login(org.users["alice"])
    html = web.get(reverse("portal:tenant-quotas", args=[org.alpha.pk])).content
    assert b"on site-b" in html and f"on {home.name}".encode() in html
