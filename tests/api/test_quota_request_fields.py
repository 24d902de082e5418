"""A quota request keeps what it does not name (issue 38): through the API, a request carries
only the values it names; approving it changes only those, the others as the quota has them
at approval time; the approver's view (`payload.changes`) and the audit say old -> new for
the named fields. Before, a request that left out weight, lend limit or per-user limit reset
them to their defaults when approved.

The org fixture's H100 quotas (GPUs guaranteed / limit): research 32/64, team-alpha 16/32.
tina administers team-alpha and asks; dana administers research and decides.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from scheduler.models import Cluster
from tenants import approvals
from tenants.models import ApprovalRequest, AuditEntry, Quota
from tests.conftest import Org

QUOTA_REQUESTS = "/api/v1/quota-requests/"
REQUESTS = "/api/v1/approval-requests/"
KEPT = {"lend_limit_milli": 4000, "weight": 3.0, "user_limit_milli": 8000}


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(approvals, "enqueue_notification", lambda request_id: None)


@pytest.fixture
def alpha(org: Org) -> Quota:
    """team-alpha's global H100 quota, 16/32, with a lend limit, weight and per-user limit."""
    Quota.objects.filter(tenant=org.alpha, flavor=org.h100).update(**KEPT)
    return Quota.objects.get(tenant=org.alpha, flavor=org.h100, cluster=None)


def ask(org: Org, client_for: Any, **named: Any) -> Any:
    body = {"tenant": org.alpha.pk, "flavor": org.h100.pk, "justification": "eval", **named}
    return client_for("tina").post(QUOTA_REQUESTS, body, format="json")


def approve(client_for: Any, request_id: int) -> None:
    response = client_for("dana").post(f"{REQUESTS}{request_id}/approve/", format="json")
    assert response.status_code == 200, response.json()


def values(quota: Quota) -> dict[str, Any]:
    quota.refresh_from_db()
    return {
        "guaranteed_milli": quota.guaranteed_milli,
        "limit_milli": quota.limit_milli,
        "lend_limit_milli": quota.lend_limit_milli,
        "weight": float(quota.weight),
        "user_limit_milli": quota.user_limit_milli,
    }


def test_a_request_for_the_guarantee_keeps_weight_lend_and_user_limits(
    org: Org, client_for: Any, alpha: Quota
) -> None:
    response = ask(org, client_for, guaranteed_milli=12000, limit_milli=40000)
    assert response.status_code == 201, response.json()
    made = response.json()
    # The request carries what it names, and says what it changes.
    assert made["payload"]["values"] == {"guaranteed_milli": 12000, "limit_milli": 40000}
    assert made["payload"]["changes"] == [
        {"field": "guaranteed_milli", "old": 16000, "new": 12000},
        {"field": "limit_milli", "old": 32000, "new": 40000},
    ]
    approve(client_for, made["id"])
    assert values(alpha) == {"guaranteed_milli": 12000, "limit_milli": 40000, **KEPT}


def test_a_request_for_the_weight_alone_changes_the_weight_alone(
    org: Org, client_for: Any, alpha: Quota
) -> None:
    response = ask(org, client_for, weight=2.5)
    assert response.status_code == 201, response.json()
    made = response.json()
    # The approver reads it: the inbox's entry names the field, old -> new.
    inbox = client_for("dana").get(f"{REQUESTS}inbox/").json()["results"]
    assert [r["payload"]["changes"] for r in inbox] == [
        [{"field": "weight", "old": 3.0, "new": 2.5}]
    ]
    # The audit of the request: the named field, old -> new, and nothing else.
    entry = AuditEntry.objects.get(action="quota.request")
    assert (entry.before, entry.after) == ({"weight": 3.0}, {"weight": 2.5, "cluster": None})
    approve(client_for, made["id"])
    assert values(alpha) == {
        "guaranteed_milli": 16000,
        "limit_milli": 32000,
        **KEPT,
        "weight": 2.5,
    }
    applied = AuditEntry.objects.get(action="quota.set", tenant=org.alpha)
    changed = {k for k in applied.after if applied.before.get(k) != applied.after[k]}
    assert changed - {"updated_at"} == {"weight"}


def test_approval_keeps_the_values_as_they_are_at_approval_time(
    org: Org, client_for: Any, alpha: Quota
) -> None:
    made = ask(org, client_for, guaranteed_milli=12000).json()
    # Between the request and its approval, dana sets the per-user limit and the weight.
    patched = client_for("dana").patch(
        f"/api/v1/quotas/{alpha.pk}/", {"user_limit_milli": 6000, "weight": 4.0}, format="json"
    )
    assert patched.status_code == 200, patched.json()
    approve(client_for, made["id"])
    assert values(alpha) == {
        "guaranteed_milli": 12000,
        "limit_milli": 32000,
        "lend_limit_milli": 4000,
        "weight": 4.0,
        "user_limit_milli": 6000,
    }


def test_a_named_null_clears_a_limit(org: Org, client_for: Any, alpha: Quota) -> None:
    made = ask(org, client_for, lend_limit_milli=None).json()
    assert made["payload"]["changes"] == [{"field": "lend_limit_milli", "old": 4000, "new": None}]
    approve(client_for, made["id"])
    assert values(alpha) == {**values(alpha), "lend_limit_milli": None, "weight": 3.0}
    assert values(alpha)["user_limit_milli"] == 8000


@pytest.mark.parametrize(
    ("named", "field", "says"),
    [
        pytest.param({}, "non_field_errors", "name at least one of", id="nothing-named"),
        pytest.param({"weight": 0}, "weight", "greater than or equal to 0.001", id="bad-weight"),
        # The guarantee kept (16 GPUs) is above the limit asked: checked against the merge.
        pytest.param(
            {"limit_milli": 8000}, "limit_milli", "below its guaranteed", id="kept-guarantee"
        ),
        pytest.param(
            {"user_limit_milli": 40000}, "user_limit_milli", "exceeds its limit", id="kept-limit"
        ),
    ],
)
def test_a_bad_request_is_a_400_that_changes_nothing(
    org: Org, client_for: Any, alpha: Quota, named: dict[str, Any], field: str, says: str
) -> None:
    before = values(alpha)
    response = ask(org, client_for, **named)
    assert response.status_code == 400, response.json()
    assert says in " ".join(response.json()["errors"][field])
    assert not ApprovalRequest.objects.exists()
    assert values(alpha) == before


def test_a_request_for_a_quota_not_there_yet_names_the_guarantee_and_limit(
    org: Org, client_for: Any, alpha: Quota
) -> None:
    site_b = Cluster.objects.create(name="site-b", backend="simulated")
    response = ask(org, client_for, cluster=site_b.pk, weight=2.0)
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]
    assert set(errors) == {"guaranteed_milli", "limit_milli"}
    assert "no quota yet" in errors["limit_milli"][0]
    # Named, the others take a new quota's defaults.
    made = ask(org, client_for, cluster=site_b.pk, guaranteed_milli=4000, limit_milli=4000).json()
    assert made["payload"]["changes"][0] == {"field": "guaranteed_milli", "old": None, "new": 4000}
    approve(client_for, made["id"])
    pin = Quota.objects.get(tenant=org.alpha, cluster=site_b)
    assert (pin.guaranteed_milli, pin.lend_limit_milli, float(pin.weight)) == (4000, None, 1.0)
    assert values(alpha) == {"guaranteed_milli": 16000, "limit_milli": 32000, **KEPT}


def test_the_portal_inbox_shows_the_named_changes(org: Org, client_for: Any, alpha: Quota) -> None:
    assert ask(org, client_for, weight=2.5, user_limit_milli=12000).status_code == 201
    client = Client()
    client.force_login(org.users["dana"])
    html = client.get(reverse("portal:approvals")).content.decode()
    assert "weight 3.0 → 2.5" in html
    assert "user_limit 8 → 12 GPUs" in html
    assert "guaranteed" not in html.split("user_limit 8")[0].split("weight 3.0")[-1]


def test_replaying_a_request_proposes_only_what_it_names(
    org: Org, client_for: Any, alpha: Quota
) -> None:
    """The approver's what-if replay of a weight-only request changes the weight alone (it
    reset the weight to 1 where the request did not name it)."""
    from django.utils import timezone

    from whatif.runs import whatif_for_approval

    made = ask(org, client_for, user_limit_milli=12000).json()
    request = ApprovalRequest.objects.get(pk=made["id"])
    run = whatif_for_approval(
        user=org.users["dana"], request=request, window_days=1, now=timezone.now()
    )
    assert run.changes == [
        {
            "kind": "quota",
            "tenant": "team-alpha",
            "flavor": org.h100.name,
            "user_limit_milli": 12000,
        }
    ]
