"""The idle rule through the API (issue 20): read by anyone who sees the tenant, with the rule in
force (own, inherited from above, or the settings' default); set and removed by the tenant's
admins and platform admins, audited; ranges checked (400 with the field); other tenants 404."""

from __future__ import annotations

from typing import Any

import pytest

from tenants.models import AuditEntry, IdleRule
from tests.conftest import Org

pytestmark = pytest.mark.django_db
GOOD = {"threshold_pct": 10, "duration_minutes": 20, "action": "notify_and_stop"}


def url(org: Org, name: str = "alpha") -> str:
    return f"/api/v1/tenants/{getattr(org, name).pk}/idle-rule/"


def test_a_member_reads_the_rule_in_force_and_cannot_change_it(
    org: Org, client_for: Any, settings: Any
) -> None:
    settings.GANTRY_IDLE_THRESHOLD_PCT, settings.GANTRY_IDLE_DURATION_S = 5.0, 1800.0
    alice = client_for("alice")
    assert alice.get(url(org)).json() == {
        "tenant": org.alpha.pk,
        "own": None,
        "effective": {
            "threshold_pct": 5.0,
            "duration_minutes": 30,
            "action": "notify",
            "origin": "default",
        },
    }
    IdleRule.objects.create(tenant=org.research, threshold_pct=2, duration_s=3600)
    effective = alice.get(url(org)).json()["effective"]
    assert (effective["threshold_pct"], effective["duration_minutes"]) == (2.0, 60)
    assert effective["origin"] == "inherited"
    assert alice.put(url(org), GOOD, format="json").status_code == 403
    assert alice.delete(url(org)).status_code == 403
    assert not IdleRule.objects.filter(tenant=org.alpha).exists()


@pytest.mark.parametrize("persona", ["bob-bravo", "chris"])
def test_another_teams_rule_is_not_found(org: Org, client_for: Any, persona: str) -> None:
    IdleRule.objects.create(tenant=org.alpha, threshold_pct=3)
    client = client_for(persona)
    assert client.get(url(org)).status_code == 404
    assert client.put(url(org), GOOD, format="json").status_code == 404
    assert client.delete(url(org)).status_code == 404
    assert IdleRule.objects.get(tenant=org.alpha).threshold_pct == 3


@pytest.mark.parametrize("admin", ["tina", "dana", "pat"])
def test_admins_set_and_remove_the_rule_audited(org: Org, client_for: Any, admin: str) -> None:
    client = client_for(admin)
    body = client.put(url(org), GOOD, format="json").json()
    assert body["own"] == {
        "threshold_pct": 10.0,
        "duration_minutes": 20,
        "action": "notify_and_stop",
    }
    assert body["effective"]["origin"] == "own"
    rule = IdleRule.objects.get(tenant=org.alpha)
    assert (rule.threshold_pct, rule.duration_s, rule.action) == (10.0, 1200, "notify_and_stop")
    entry = AuditEntry.objects.get(action="tenant.idle_rule.set")
    assert (entry.actor_name, entry.tenant_id, entry.before) == (admin, org.alpha.pk, None)
    assert entry.after == {"threshold_pct": 10.0, "duration_s": 1200, "action": "notify_and_stop"}
    removed = client.delete(url(org))
    assert (removed.status_code, removed.content) == (204, b"")  # as documented (issue 34)
    body = client.get(url(org)).json()
    assert body["own"] is None and body["effective"]["origin"] == "default"
    assert AuditEntry.objects.filter(action="tenant.idle_rule.delete").count() == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"threshold_pct": -1}, "threshold_pct"),
        ({"threshold_pct": 100.5}, "threshold_pct"),
        ({"threshold_pct": "lots"}, "threshold_pct"),
        ({"duration_minutes": 0}, "duration_minutes"),
        ({"duration_minutes": 7 * 24 * 60 + 1}, "duration_minutes"),
        ({"duration_minutes": 1.5}, "duration_minutes"),
        ({"action": "shutdown"}, "action"),
        ({"extra": 1}, "extra"),
    ],
    ids=[
        "negative",
        "over-100",
        "text",
        "zero-minutes",
        "over-a-week",
        "fraction",
        "bad-action",
        "unknown-field",
    ],
)
def test_bad_values_are_a_400_naming_the_field_and_change_nothing(
    org: Org, client_for: Any, change: dict[str, Any], field: str
) -> None:
    response = client_for("tina").put(url(org), {**GOOD, **change}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]
    assert not IdleRule.objects.exists() and not AuditEntry.objects.exists()


def test_a_missing_field_is_a_400(org: Org, client_for: Any) -> None:
    response = client_for("tina").put(url(org), {"threshold_pct": 5}, format="json")
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"duration_minutes", "action"}
