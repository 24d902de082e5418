"""Rate cards through the API: who may set them, bad prices, the chain of versions, audit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from billing.currency import validate_currency
from billing.models import MeteringPeriod, RateCard
from tenants.models import AuditEntry
from tests.conftest import Org

URL = "/api/v1/rate-cards/"
JAN = datetime(2031, 1, 1, tzinfo=UTC)
FEB = datetime(2031, 2, 1, tzinfo=UTC)
MAR = datetime(2031, 3, 1, tzinfo=UTC)


def body(org: Org, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "flavor": org.h100.pk,
        "valid_from": JAN.isoformat(),
        "gpu_hour": "2.50",
        "cpu_core_hour": "0.04",
        "memory_gib_hour": "0.005",
    }
    data.update(overrides)
    return data


def test_platform_admin_adds_a_rate_and_the_change_is_audited(org: Org, client_for: Any) -> None:
    response = client_for("pat").post(
        URL, body(org, priority_multipliers={"critical": "1.5", "low": "0.5"}), format="json"
    )
    assert response.status_code == 201, response.json()
    data = response.json()
    assert (data["gpu_hour"], data["currency"], data["valid_to"]) == ("2.500000", "EUR", None)
    assert data["priority_multipliers"] == {"critical": "1.5000", "low": "0.5000"}
    entry = AuditEntry.objects.get(action="rate_card.add")
    assert entry.actor_name == "pat" and entry.target_id == str(data["id"])
    assert entry.after["gpu_hour"] == "2.500000"
    assert entry.after["multipliers"] == {"critical": "1.5000", "low": "0.5000"}


@pytest.mark.parametrize("persona", ["alice", "tina", "dana"])
def test_only_finance_and_platform_admins_set_rates_everyone_reads_them(
    org: Org, client_for: Any, persona: str
) -> None:
    client_for("pat").post(URL, body(org), format="json")
    client = client_for(persona)
    assert client.post(URL, body(org, valid_from=FEB.isoformat()), format="json").status_code == 403
    card = RateCard.objects.get()
    assert client.delete(f"{URL}{card.pk}/").status_code == 403
    listed = client.get(URL).json()["results"]
    assert [c["id"] for c in listed] == [card.pk]
    assert RateCard.objects.count() == 1


def test_finance_adds_a_version_and_only_platform_admins_withdraw(
    org: Org, client_for: Any
) -> None:
    """Finance owns prices (issue 38: the portal's rate cards page is finance's too)."""
    client_for("pat").post(URL, body(org), format="json")
    carol = client_for("carol")
    added = carol.post(URL, body(org, valid_from=FEB.isoformat()), format="json")
    assert added.status_code == 201, added.json()
    assert AuditEntry.objects.filter(action="rate_card.add", actor_name="carol").count() == 1
    assert carol.delete(f"{URL}{added.json()['id']}/").status_code == 403
    assert RateCard.objects.count() == 2


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("gpu_hour", "-1.00", "must not be negative."),
        ("gpu_hour", "abc", 'must be a decimal number such as "2.50"'),
        ("gpu_hour", "1e3", 'must be a decimal number such as "2.50"'),
        ("gpu_hour", "NaN", 'must be a decimal number such as "2.50"'),
        ("gpu_hour", "0.1234567", 'must be a decimal number such as "2.50"'),
        ("gpu_hour", 2.5, "must be a decimal number in a string"),
        ("cpu_core_hour", True, "must be a decimal number in a string"),
        ("memory_gib_hour", "", 'must be a decimal number such as "2.50"'),
        ("borrowed_discount", "1.5", "must be at most 1."),
        ("priority_multipliers", {"no-such-class": "2"}, "unknown priority class(es): no-such"),
        ("priority_multipliers", {"low": "-0.5"}, "must not be negative."),
        ("valid_from", "yesterday", "Datetime has wrong format"),
        ("valid_from", "2031-01-01T10:30:00Z", "rates change on the hour"),
        ("valid_to", "2031-02-01T00:00:01Z", "rates change on the hour"),
    ],
    ids=lambda v: str(v)[:20],
)
def test_bad_prices_are_refused_naming_the_field(
    org: Org, client_for: Any, field: str, value: Any, message: str
) -> None:
    response = client_for("pat").post(URL, body(org, **{field: value}), format="json")
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]
    assert list(errors) == [field]
    assert message in str(errors[field])
    assert not RateCard.objects.exists()
    assert not AuditEntry.objects.filter(action__startswith="rate_card").exists()


def test_a_new_version_closes_the_open_one_at_its_start(org: Org, client_for: Any) -> None:
    client = client_for("pat")
    first = client.post(URL, body(org), format="json").json()
    second = client.post(URL, body(org, valid_from=FEB.isoformat(), gpu_hour="3"), format="json")
    assert second.status_code == 201, second.json()
    versions = list(RateCard.objects.values_list("valid_from", "valid_to", "gpu_hour"))
    assert versions == [(JAN, FEB, 2.5), (FEB, None, 3)]
    close = AuditEntry.objects.get(action="rate_card.close")
    assert close.target_id == str(first["id"])
    assert (close.before["valid_to"], close.after["valid_to"]) == (None, "2031-02-01T00:00:00Z")


@pytest.mark.parametrize(
    ("start", "message"),
    [
        (JAN, "overlaps version"),
        (JAN - timedelta(days=1), "overlaps version"),
        (FEB - timedelta(hours=1), "overlaps version"),
        (FEB + timedelta(hours=1), "leaves a gap after version"),
    ],
    ids=["same-start", "before-start", "inside", "gap"],
)
def test_gaps_and_overlaps_are_refused(
    org: Org, client_for: Any, start: datetime, message: str
) -> None:
    client = client_for("pat")
    client.post(URL, body(org, valid_to=FEB.isoformat()), format="json")
    response = client.post(URL, body(org, valid_from=start.isoformat()), format="json")
    assert response.status_code == 400, response.json()
    assert message in response.json()["errors"]["valid_from"][0]
    assert RateCard.objects.count() == 1


def test_the_version_that_continues_a_closed_chain_is_accepted(org: Org, client_for: Any) -> None:
    client = client_for("pat")
    client.post(URL, body(org, valid_to=FEB.isoformat()), format="json")
    response = client.post(URL, body(org, valid_from=FEB.isoformat()), format="json")
    assert response.status_code == 201, response.json()


def test_a_rate_never_starts_inside_metered_time(org: Org, client_for: Any) -> None:
    client = client_for("pat")
    client.post(URL, body(org), format="json")
    MeteringPeriod.objects.create(
        start=FEB, end=FEB + timedelta(hours=1), metered_at=FEB + timedelta(hours=2)
    )
    retro = client.post(URL, body(org, valid_from=FEB.isoformat()), format="json")
    assert retro.status_code == 400
    assert "never retroactively" in retro.json()["errors"]["valid_from"][0]
    later = client.post(
        URL, body(org, valid_from=(FEB + timedelta(hours=1)).isoformat()), format="json"
    )
    assert later.status_code == 201, later.json()


def test_a_future_version_can_be_withdrawn_and_the_previous_reopens(
    org: Org, client_for: Any
) -> None:
    client = client_for("pat")
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    client.post(URL, body(org, valid_from=(now - timedelta(days=1)).isoformat()), format="json")
    future = client.post(URL, body(org, valid_from=MAR.isoformat()), format="json").json()
    in_force = RateCard.objects.get(valid_to=MAR)
    assert client.delete(f"{URL}{in_force.pk}/").status_code == 400  # not the last one
    assert client.delete(f"{URL}{future['id']}/").status_code == 204
    in_force.refresh_from_db()
    assert in_force.valid_to is None
    assert client.delete(f"{URL}{in_force.pk}/").status_code == 400  # in force
    assert AuditEntry.objects.filter(action="rate_card.withdraw").count() == 1


@pytest.mark.parametrize("code", ["EUR", "usd", " JPY "])
def test_currency_codes_of_iso_4217_are_accepted(code: str) -> None:
    assert validate_currency(code) == code.strip().upper()


@pytest.mark.parametrize("code", ["EURO", "ABC", "XXX", "", "€"])
def test_other_currency_codes_are_refused(code: str) -> None:
    with pytest.raises(ValueError, match="not an ISO 4217 currency code"):
        validate_currency(code)


def test_an_unknown_installation_currency_stops_the_process_at_start() -> None:
    from tests.test_settings import manage

    result = manage("check", env={"GANTRY_BILLING_CURRENCY": "ABC"})
    assert result.returncode != 0
    assert "GANTRY_BILLING_CURRENCY: 'ABC' is not an ISO 4217 currency code" in result.stderr
