"""The capacity API: who sees which plans, bad input refused with nothing changed, targets,
TCO inputs and rate suggestions (audited; accepting adds a rate card through billing)."""

from __future__ import annotations

import io
from datetime import date

import pytest
from openpyxl import load_workbook

from billing.models import RateCard
from capacity.models import PoolTarget, RateSuggestion, TcoInputs
from tenants.models import AuditEntry
from tests.capacity.builders import stored_run

pytestmark = pytest.mark.django_db

PLANS = "/api/v1/capacity/plans/"
TCO = {
    "purchase_price": "24000",
    "depreciation_months": 36,
    "power_cooling_per_gpu_hour": "0.2",
    "hosting_support_per_month": "100",
    "on_demand_per_gpu_hour": "2.5",
    "committed_per_gpu_hour": "1.8",
}


@pytest.fixture
def run(org):
    return stored_run(org)


def test_finance_sees_the_pool_its_saturation_drivers_and_options(run, client_for) -> None:
    body = client_for("carol").get(PLANS).json()
    assert body["run"]["id"] == run.pk
    [plan] = body["results"]
    assert plan["flavor"] == "H100-80GB" and plan["subtree"] is None
    # Pool p50 on forecast day i: 60 + 1.75 x (28 + i) > 153.6 from i = 26 (day 27).
    assert plan["saturation"]["p50_day"] == "2026-12-16"
    assert [d["name"] for d in plan["drivers"]] == ["team-alpha", "team-bravo", "team-charlie"]
    assert plan["options"] and all(o["gpus"] > 0 for o in plan["options"])
    assert plan["tco"] == {}  # no TCO inputs yet


@pytest.mark.parametrize(
    ("persona", "subtrees", "teams"),
    [
        ("dana", ["research"], {"team-alpha", "team-bravo"}),
        ("tina", ["team-alpha"], set()),
    ],
    ids=["department-admin", "team-admin"],
)
def test_a_tenant_admin_sees_only_their_subtree(run, client_for, persona, subtrees, teams) -> None:
    response = client_for(persona).get(PLANS)
    assert response.status_code == 200
    plans = response.json()["results"]
    assert [p["subtree"] for p in plans] == subtrees
    assert {d["name"] for p in plans for d in p["drivers"]} == teams
    assert all(p["saturation"] is None and p["capacity_gpus"] is None for p in plans)
    text = response.content.decode()
    assert "team-charlie" not in text and "product" not in text
    export = client_for(persona).get("/api/v1/capacity/export/?format=csv")
    assert export.status_code == 200 and "team-charlie" not in export.content.decode()


@pytest.mark.parametrize("persona", ["alice", "chris", "bob-bravo"])
def test_members_get_403(run, client_for, persona) -> None:
    client = client_for(persona)
    for url in [
        PLANS,
        "/api/v1/capacity/export/",
        "/api/v1/capacity/tco-inputs/",
        "/api/v1/capacity/targets/",
        "/api/v1/capacity/rate-suggestions/",
    ]:
        assert client.get(url).status_code == 403, url


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("gpus=many", "gpus"),
        ("gpus=100000", "gpus"),
        ("flavor=", "flavor"),
        ("format=pdf", "format"),
    ],
    ids=["gpus-text", "gpus-too-many", "flavor-empty", "format-unknown"],
)
def test_bad_queries_are_400_naming_the_parameter(run, client_for, query, field) -> None:
    url = "/api/v1/capacity/export/" if field == "format" else PLANS
    response = client_for("carol").get(f"{url}?{query}")
    assert response.status_code == 400
    assert field in response.json()["errors"]


def test_an_option_of_your_own(run, client_for) -> None:
    [plan] = client_for("pat").get(PLANS + "?gpus=16").json()["results"]
    assert 16 in [o["gpus"] for o in plan["options"]]


def test_finance_enters_tco_and_the_plan_explains_owning_against_renting(run, org, client_for):
    client = client_for("carol")
    response = client.post(
        "/api/v1/capacity/tco-inputs/", {"flavor": org.h100.pk, **TCO}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert AuditEntry.objects.filter(action="capacity.tco.set").count() == 1
    [plan] = client.get(PLANS + "?gpus=8").json()["results"]
    assert "46.3%" in plan["tco"]["break_even_utilization"]["explain"]
    option = next(o for o in plan["options"] if o["gpus"] == 8)
    assert option["months"] and option["own_total"] > 0
    assert option["break_even_month"]["explain"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"purchase_price": "-1"}, "purchase_price"),
        ({"depreciation_months": 0}, "depreciation_months"),
        ({"on_demand_per_gpu_hour": 2.5}, "on_demand_per_gpu_hour"),
        ({"cost": "1"}, "cost"),
    ],
    ids=["negative", "no-months", "float-not-string", "unknown-field"],
)
def test_bad_tco_inputs_are_400_and_store_nothing(org, client_for, change, field) -> None:
    response = client_for("carol").post(
        "/api/v1/capacity/tco-inputs/", {"flavor": org.h100.pk, **TCO, **change}, format="json"
    )
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert not TcoInputs.objects.exists()


def test_targets_are_set_by_platform_admins(org, client_for) -> None:
    url = "/api/v1/capacity/targets/"
    body = {"flavor": org.h100.pk, "target_utilization": "0.7"}
    assert client_for("carol").post(url, body, format="json").status_code == 403
    bad = client_for("pat").post(url, {**body, "target_utilization": "1.5"}, format="json")
    assert bad.status_code == 400 and "target_utilization" in bad.json()["errors"]
    assert client_for("pat").post(url, body, format="json").status_code == 200
    assert float(PoolTarget.objects.get().target_utilization) == 0.7
    assert AuditEntry.objects.filter(action="capacity.target.set").count() == 1


def test_a_rate_suggestion_is_rejected_and_accepted_by_finance(org, client_for) -> None:
    url = "/api/v1/capacity/rate-suggestions/"
    carol, pat = client_for("carol"), client_for("pat")
    body = {"flavor": org.h100.pk, "target_utilization": "0.8"}
    missing = carol.post(url, body, format="json")
    assert missing.status_code == 400 and "flavor" in missing.json()["errors"]  # no TCO yet
    carol.post("/api/v1/capacity/tco-inputs/", {"flavor": org.h100.pk, **TCO}, format="json")

    first = carol.post(url, body, format="json").json()
    # (24000 / 36 + 100) / (720 x 0.8) + 0.2 = 1.5310
    assert first["gpu_hour"] == "1.5310" and first["state"] == "pending"
    assert carol.post(f"{url}{first['id']}/reject/", {}, format="json").status_code == 400
    rejected = carol.post(f"{url}{first['id']}/reject/", {"reason": "too low"}, format="json")
    assert rejected.json()["state"] == "rejected"

    second = carol.post(url, body, format="json").json()
    # Finance owns prices: it accepts the price it reviewed, and the rate card is its act.
    accepted = carol.post(f"{url}{second['id']}/accept/", {}, format="json")
    assert accepted.status_code == 200, accepted.json()
    card = RateCard.objects.get(pk=accepted.json()["rate_card"])
    assert str(card.gpu_hour) == "1.531000" and card.valid_from.day == 1
    assert card.created_by.username == "carol"
    assert RateSuggestion.objects.get(pk=second["id"]).state == "accepted"
    assert pat.post(f"{url}{second['id']}/accept/", {}, format="json").status_code == 409
    actors = dict(AuditEntry.objects.values_list("action", "actor_name"))
    assert actors["rate_card.add"] == "carol"
    assert actors["capacity.rate_suggestion.accepted"] == "carol"
    assert {"capacity.rate_suggestion.create", "capacity.rate_suggestion.rejected"} <= set(actors)


def test_a_platform_admin_accepts_a_suggestion_too(org, client_for) -> None:
    url = "/api/v1/capacity/rate-suggestions/"
    pat = client_for("pat")
    pat.post("/api/v1/capacity/tco-inputs/", {"flavor": org.h100.pk, **TCO}, format="json")
    made = pat.post(url, {"flavor": org.h100.pk, "target_utilization": "0.8"}, format="json")
    accepted = pat.post(f"{url}{made.json()['id']}/accept/", {}, format="json")
    assert accepted.status_code == 200, accepted.json()
    assert RateCard.objects.get().created_by.username == "pat"


def test_a_rate_suggestion_is_invisible_to_a_tenant_admin(org, client_for) -> None:
    client_for("carol").post(
        "/api/v1/capacity/tco-inputs/", {"flavor": org.h100.pk, **TCO}, format="json"
    )
    sid = (
        client_for("carol")
        .post(
            "/api/v1/capacity/rate-suggestions/",
            {"flavor": org.h100.pk, "target_utilization": "0.8"},
            format="json",
        )
        .json()["id"]
    )
    assert client_for("dana").get(f"/api/v1/capacity/rate-suggestions/{sid}/").status_code == 404


def test_the_export_as_csv_and_xlsx(run, client_for) -> None:
    client = client_for("carol")
    csv_text = client.get("/api/v1/capacity/export/?format=csv&gpus=8").content.decode()
    assert csv_text.startswith("pool,subtree,figure,value,explain")
    assert "saturation_p50,2026-12-16" in csv_text
    xlsx = client.get("/api/v1/capacity/export/?format=xlsx")
    book = load_workbook(io.BytesIO(xlsx.content))
    assert book.sheetnames == ["Figures", "Daily"]
    daily = list(book["Daily"].iter_rows(values_only=True))
    assert daily[0][:3] == ("pool", "subtree", "date")
    assert len(daily) == 1 + 28 + 120  # finance sees the pool: its history and forecast days
    assert daily[1][2] == date(2026, 10, 23).isoformat()


def test_the_plans_read_in_as_many_queries_for_three_pools_as_for_one(org, client_for) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from capacity.models import PoolForecast

    run = stored_run(org)
    client = client_for("carol")
    client.get(PLANS)  # the first request of a client reads what later ones find cached
    with CaptureQueriesContext(connection) as one:
        assert len(client.get(PLANS).json()["results"]) == 1
    for name in ("A100-40GB", "L40S"):
        for row in PoolForecast.objects.filter(run=run, flavor="H100-80GB"):
            row.pk, row.flavor = None, name
            row.save()
    with CaptureQueriesContext(connection) as three:
        assert len(client.get(PLANS).json()["results"]) == 3
    assert len(three) == len(one)
