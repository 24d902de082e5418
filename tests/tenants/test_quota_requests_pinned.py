"""Quota requests for a quota pinned to a cluster (issue 38): the request names the cluster
(`cluster`, null: global), shows it, is checked at once against the pin rules
(`tenants.quotas.pins`) and again at approval, and approving it sets the pinned row.

The org fixture's H100 quotas (GPUs guaranteed / limit): research 32/64, team-alpha 16/32,
team-bravo 16/32. tina administers team-alpha and asks; dana administers research and decides.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from scheduler.models import Cluster
from tenants import services
from tenants.approvals import approval_decide, quota_request_create
from tenants.models import ApprovalRequest, ApprovalState, AuditEntry, Quota
from tenants.quotas.rules import QuotaValues
from tests.conftest import Org

QUOTA_REQUESTS = "/api/v1/quota-requests/"


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def site_b(db: Any) -> Cluster:
    return Cluster.objects.create(name="site-b", backend="simulated")


def values(guaranteed: float, limit: float) -> QuotaValues:
    return QuotaValues(round(guaranteed * 1000), round(limit * 1000), None, 1.0)


def ask(org: Org, cluster: Cluster | None, guaranteed: float, limit: float) -> ApprovalRequest:
    return quota_request_create(
        user=org.users["tina"],
        tenant=org.alpha,
        flavor=org.h100,
        values=values(guaranteed, limit),
        justification="eval on site-b",
        cluster=cluster,
    )


def rows() -> list[tuple[Any, ...]]:
    return list(
        Quota.objects.order_by("tenant__slug", "cluster__name").values_list(
            "tenant__slug", "cluster__name", "guaranteed_milli", "limit_milli"
        )
    )


def test_approving_a_pinned_request_sets_the_pinned_row_only(org: Org, site_b: Cluster) -> None:
    request = ask(org, site_b, 8, 16)
    assert request.payload["cluster"] == site_b.pk
    assert request.payload["cluster_name"] == "site-b"
    assert request.payload["current"] is None  # no pin on site-b yet
    audit = AuditEntry.objects.get(action="quota.request")
    assert audit.after["cluster"] == site_b.pk
    approval_decide(user=org.users["dana"], request=request, approve=True, comment="ok")
    assert Quota.objects.get(tenant=org.alpha, cluster=site_b).guaranteed_milli == 8000
    assert Quota.objects.get(tenant=org.alpha, cluster__isnull=True).guaranteed_milli == 16000
    made = AuditEntry.objects.filter(action="quota.set", tenant=org.alpha).get()
    assert made.after["cluster"] == site_b.pk


def test_a_pinned_request_that_breaks_the_pin_rules_is_refused_at_once(
    org: Org, site_b: Cluster
) -> None:
    before = rows()
    with pytest.raises(ValidationError) as caught:
        ask(org, site_b, 20, 20)  # above alpha's global guarantee of 16
    # tina cannot see research: the error names no figure of it or of its other children
    message = " ".join(caught.value.message_dict["guaranteed_milli"])
    assert "does not fit what 'research' holds for H100-80GB on cluster site-b" in message
    assert "GPUs" not in message
    assert not ApprovalRequest.objects.exists() and rows() == before


def test_a_pinned_request_is_checked_again_at_approval(org: Org, site_b: Cluster) -> None:
    request = ask(org, site_b, 8, 16)
    # meanwhile research pins 4 GPUs on site-b: alpha's 8 no longer fits under it
    services.quota_set(
        user=org.users["pat"],
        tenant=org.research,
        flavor=org.h100,
        values=values(4, 40),
        cluster=site_b,
    )
    before = rows()
    with pytest.raises(ValidationError, match="holds on site-b: its pinned guarantee there"):
        approval_decide(user=org.users["dana"], request=request, approve=True, comment="")
    request.refresh_from_db()
    assert request.state == ApprovalState.PENDING and rows() == before


def test_the_api_takes_a_cluster_and_the_inbox_shows_it(
    org: Org, site_b: Cluster, client_for: Any
) -> None:
    body = {
        "tenant": org.alpha.pk,
        "flavor": org.h100.pk,
        "cluster": site_b.pk,
        "guaranteed_milli": 8000,
        "limit_milli": 16000,
    }
    made = client_for("tina").post(QUOTA_REQUESTS, body, format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["payload"]["cluster_name"] == "site-b"
    web = Client()
    web.force_login(org.users["dana"])
    assert "Quota H100-80GB on site-b" in web.get(reverse("portal:approvals")).content.decode()
    approved = client_for("dana").post(f"/api/v1/approval-requests/{made.json()['id']}/approve/")
    assert approved.status_code == 200, approved.json()
    assert Quota.objects.get(tenant=org.alpha, cluster=site_b).limit_milli == 16000


@pytest.mark.parametrize(
    ("change", "field"),
    [({"cluster": 999_999}, "cluster"), ({"guaranteed_milli": 20000}, "guaranteed_milli")],
    ids=["unknown-cluster", "above-the-global-guarantee"],
)
def test_a_bad_pinned_request_is_a_400_and_changes_nothing(
    org: Org, site_b: Cluster, client_for: Any, change: dict[str, Any], field: str
) -> None:
    body = {
        "tenant": org.alpha.pk,
        "flavor": org.h100.pk,
        "cluster": site_b.pk,
        "guaranteed_milli": 8000,
        "limit_milli": 20000,
        **change,
    }
    answer = client_for("tina").post(QUOTA_REQUESTS, body, format="json")
    assert answer.status_code == 400
    assert field in answer.json()["errors"]
    assert not ApprovalRequest.objects.exists()


# -- pending at once (one per tenant, flavor and cluster) ---------------------------------


def test_a_global_and_a_pinned_request_of_one_flavor_are_pending_at_once(
    org: Org, site_b: Cluster, client_for: Any
) -> None:
    site_c = Cluster.objects.create(name="site-c", backend="simulated")
    tina = client_for("tina")
    body = {"tenant": org.alpha.pk, "flavor": org.h100.pk, "limit_milli": 20000}
    made = [
        tina.post(QUOTA_REQUESTS, {**body, "guaranteed_milli": g, "cluster": c}, format="json")
        for g, c in ((16000, None), (8000, site_b.pk), (4000, site_c.pk))
    ]
    assert [m.status_code for m in made] == [201, 201, 201], [m.json() for m in made]
    pending = ApprovalRequest.objects.filter(state=ApprovalState.PENDING)
    assert sorted(r.subject_cluster for r in pending) == sorted([0, site_b.pk, site_c.pk])
    # each approved sets its own row
    for answer in made:
        decided = client_for("dana").post(
            f"/api/v1/approval-requests/{answer.json()['id']}/approve/"
        )
        assert decided.status_code == 200, decided.json()
    assert {row[1:] for row in rows() if row[0] == "team-alpha"} == {
        ("site-b", 8000, 20000),
        ("site-c", 4000, 20000),
        (None, 16000, 20000),
    }


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "global"])
def test_a_second_request_for_the_same_tenant_flavor_and_cluster_is_a_409(
    org: Org, site_b: Cluster, client_for: Any, pinned: bool
) -> None:
    body = {
        "tenant": org.alpha.pk,
        "flavor": org.h100.pk,
        "cluster": site_b.pk if pinned else None,
        "guaranteed_milli": 8000,
        "limit_milli": 16000,
    }
    first = client_for("tina").post(QUOTA_REQUESTS, body, format="json")
    assert first.status_code == 201, first.json()
    second = client_for("tina").post(QUOTA_REQUESTS, {**body, "limit_milli": 20000}, format="json")
    assert second.status_code == 409
    where = "H100-80GB on cluster site-b" if pinned else "H100-80GB (global)"
    assert second.json()["detail"] == (
        f"A quota request for {where} of 'team-alpha' is already pending "
        f"(#{first.json()['id']}): wait for its decision, or withdraw it first."
    )
    assert ApprovalRequest.objects.count() == 1
    assert ApprovalRequest.objects.get().payload["values"]["limit_milli"] == 16000


def test_the_database_refuses_two_pending_requests_for_one_tenant_flavor_and_cluster(
    org: Org, site_b: Cluster
) -> None:
    from django.db import IntegrityError, transaction

    """The partial unique index, not the service's read, refuses the twin."""
    made = ask(org, site_b, 8, 16)
    twin = {
        "kind": made.kind,
        "tenant": made.tenant,
        "requester": made.requester,
        "subject_id": made.subject_id,
        "expires_at": made.expires_at,
    }
    ApprovalRequest.objects.create(**twin)  # the global one of the flavor: allowed
    with pytest.raises(IntegrityError), transaction.atomic():
        ApprovalRequest.objects.create(**twin, subject_cluster=site_b.pk)


# -- the portal's quota form ---------------------------------------------------------------


def quota_form(org: Org, **change: str) -> dict[str, str]:
    return {
        "flavor": org.h100.name,
        "cluster": "site-b",
        "guaranteed": "8",
        "limit": "16",
        "weight": "1",
        "justification": "eval on site-b",
        **change,
    }


def test_the_portal_form_sets_a_pin_for_those_above_and_requests_one_for_the_team(
    org: Org, site_b: Cluster
) -> None:
    url = reverse("portal:tenant-quotas", args=[org.alpha.pk])
    dana, tina = Client(), Client()
    dana.force_login(org.users["dana"])  # admin of research: sets alpha's quota
    tina.force_login(org.users["tina"])  # admin of alpha: asks
    assert tina.post(url, quota_form(org, guaranteed="4")).status_code == 302
    request = ApprovalRequest.objects.get()
    assert request.payload["cluster_name"] == "site-b"
    assert not Quota.objects.filter(cluster=site_b).exists()
    request.delete()
    assert dana.post(url, quota_form(org)).status_code == 302
    pinned = Quota.objects.get(tenant=org.alpha, cluster=site_b)
    assert (pinned.guaranteed_milli, pinned.limit_milli, pinned.lend_limit_milli) == (
        8000,
        16000,
        None,
    )
    # the global quota keeps its own values
    assert Quota.objects.get(tenant=org.alpha, cluster__isnull=True).guaranteed_milli == 16000


def test_the_portal_form_shows_a_bad_pin_at_its_field(org: Org, site_b: Cluster) -> None:
    url = reverse("portal:tenant-quotas", args=[org.alpha.pk])
    dana = Client()
    dana.force_login(org.users["dana"])
    before = rows()
    answer = dana.post(url, quota_form(org, lend_limit="2"))
    assert answer.status_code == 400
    html = answer.content.decode()
    start = html.index('id="field-lend_limit"')
    assert "a quota pinned to a cluster sets guaranteed_milli and limit_milli only" in html[start:]
    assert rows() == before
