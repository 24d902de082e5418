"""Rate cards per cluster (issue 38): a card may name a cluster; a cluster's usage is priced by
its own card, a cluster without one by the default card (cluster null); statement lines,
cost lines and exports carry the cluster.

The installation: the home cluster, `site-b` and `site-c`. The H100 default card costs 2.00
a GPU-hour; home's own card 3.00 and site-b's 5.00; site-c has none. One job on each
cluster holds one whole device for hour 0, and that hour is metered.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import IntegrityError, transaction

from billing.metering.hourly import meter_usage
from billing.models import BudgetSpend, RateCard, StatementLine
from billing.rates import rating
from billing.rates.cards import RatePrices, rate_card_add, rate_card_withdraw
from billing.statements.closing import statement_close
from billing.statements.rollup import organisation_lines
from scheduler.models import Cluster
from tenants.models import AuditEntry
from tests.billing.builders import T0, at, hold, job_for, make_node
from tests.conftest import Org

URL = "/api/v1/rate-cards/"
EXPORT = "/api/v1/costs/export/"
WINDOW = {"from": "2031-01-31T20:00:00Z", "to": "2031-01-31T21:00:00Z"}  # hour 0
EARLY = T0 - timedelta(days=30)


def installation(org: Org) -> dict[str, Cluster]:
    """The three clusters, their cards, one job on each holding a device in hour 0, metered."""
    pat = org.users["pat"]
    clusters = {
        "home": Cluster.objects.get(home=True),
        "site-b": Cluster.objects.create(name="site-b", backend="simulated"),
        "site-c": Cluster.objects.create(name="site-c", backend="simulated"),
    }
    rate_card_add(user=pat, flavor=org.h100, valid_from=EARLY, prices=RatePrices(Decimal(2)))
    for name, price in (("home", 3), ("site-b", 5)):
        rate_card_add(
            user=pat,
            flavor=org.h100,
            cluster=clusters[name],
            valid_from=EARLY,
            prices=RatePrices(Decimal(price)),
        )
    for name, cluster in clusters.items():
        node = make_node("n1" if cluster.home else f"{name}:n1", gpus=1)
        node.cluster = cluster
        node.save(update_fields=["cluster"])
        hold(job_for(org), node, 0, 1, [1000])
    assert meter_usage(now=at(2)) == 1
    return clusters


def used(lines: list[Any]) -> dict[str, Decimal]:
    """cluster -> the amount of the used GPU lines."""
    out: dict[str, Decimal] = {}
    for draft in lines:
        line = draft.line
        if line.kind == "used" and line.resource == "gpu":
            out[line.cluster] = out.get(line.cluster, Decimal(0)) + line.amount
    return out


# --- rating, pure ---------------------------------------------------------------------------

D = datetime(2031, 1, 1, tzinfo=UTC)


def h(hours: int) -> datetime:
    return D + timedelta(hours=hours)


DEFAULT = [
    rating.Rate("H100", h(0), h(10), Decimal(2)),
    rating.Rate("H100", h(10), None, Decimal(4)),
]


@pytest.mark.parametrize(
    ("own", "expected"),
    [
        # No card of its own: the default chain, whole.
        pytest.param([], [(h(0), h(10), 2), (h(10), None, 4)], id="default-whole"),
        # Its own from hour 5 to 12: the default before and after, cut at 5 and at 12.
        pytest.param(
            [rating.Rate("H100", h(5), h(12), Decimal(7), cluster="b")],
            [(h(0), h(5), 2), (h(5), h(12), 7), (h(12), None, 4)],
            id="own-inside",
        ),
        # Its own from hour 3, open-ended: the default before it only.
        pytest.param(
            [rating.Rate("H100", h(3), None, Decimal(7), cluster="b")],
            [(h(0), h(3), 2), (h(3), None, 7)],
            id="own-open",
        ),
        # Another cluster's card changes nothing for this one.
        pytest.param(
            [rating.Rate("H100", h(0), None, Decimal(9), cluster="c")],
            [(h(0), h(10), 2), (h(10), None, 4)],
            id="another-clusters",
        ),
    ],
)
def test_a_clusters_chain_is_its_own_cards_and_the_default_around_them(
    own: list[rating.Rate], expected: list[tuple[datetime, datetime | None, int]]
) -> None:
    chain = rating.chain_for([*DEFAULT, *own], "H100", "b")
    assert [(r.valid_from, r.valid_to, r.gpu_hour) for r in chain] == expected


def test_rating_prices_each_usage_by_its_clusters_chain() -> None:
    rates = [*DEFAULT, rating.Rate("H100", h(5), h(12), Decimal(7), cluster="b")]
    usages = [
        # 4 to 6 on b: an hour at 2 (default), an hour at 7 (b's).
        rating.Usage("acct", "H100", "used", h(4), h(6), 1000, cluster="b"),
        # 4 to 6 on c: two hours at 2.
        rating.Usage("acct", "H100", "used", h(4), h(6), 1000, cluster="c"),
    ]
    lines = {(line.cluster, line.rate): line.amount for line in rating.rate_usage(usages, rates)}
    assert lines == {
        ("b", 2): Decimal("2.00"),
        ("b", 7): Decimal("7.00"),
        ("c", 2): Decimal("4.00"),
    }


# --- the test: two clusters with different rates, one without a card ---------------


def test_each_clusters_hour_is_priced_by_its_own_card_or_the_default(org: Org) -> None:
    clusters = installation(org)
    home = clusters["home"].name
    # One GPU-hour on each: home's card 3.00, site-b's 5.00, site-c by the default 2.00.
    lines = organisation_lines(org.acme, at(0), at(1))
    assert used(lines) == {
        home: Decimal("3.00"),
        "site-b": Decimal("5.00"),
        "site-c": Decimal("2.00"),
    }


def test_budget_spend_prices_each_cluster_by_its_card(org: Org) -> None:
    installation(org)
    # Metering adds the hour to the spend as the statement prices it: 3 + 5 + 2.
    assert BudgetSpend.objects.get(tenant=org.alpha).amount == Decimal("10.00")


def test_a_closed_statement_keeps_a_line_per_cluster(org: Org) -> None:
    clusters = installation(org)
    statement = statement_close(
        user=org.users["carol"], organisation=org.acme, start=at(0), end=at(1), now=at(5)
    )
    rows = StatementLine.objects.filter(statement=statement, kind="used", resource="gpu")
    assert sorted(rows.values_list("cluster", "rate", "amount")) == sorted(
        [
            (clusters["home"].name, Decimal(3), Decimal("3.00")),
            ("site-b", Decimal(5), Decimal("5.00")),
            ("site-c", Decimal(2), Decimal("2.00")),
        ]
    )


def csv_rows(response: Any) -> list[dict[str, str]]:
    assert response.status_code == 200, response.content[:500]
    data = b"".join(response.streaming_content).decode("utf-8-sig")
    return list(csv.DictReader(io.StringIO(data)))


def test_exports_name_each_cluster(org: Org, client_for: Any) -> None:
    clusters = installation(org)
    home = clusters["home"].name
    client = client_for("carol")
    by_cluster = csv_rows(client.get(EXPORT, {**WINDOW, "format": "csv", "by": "cluster"}))
    charged = {r["cluster"]: r["charged_EUR"] for r in by_cluster if r["cluster"] != "Total"}
    assert {k: v for k, v in charged.items() if k} == {
        home: "3.00",
        "site-b": "5.00",
        "site-c": "2.00",
    }
    focus = csv_rows(client.get(EXPORT, {**WINDOW, "format": "focus", "kind": "used"}))
    gpu = [r for r in focus if r["PricingUnit"] == "GPU-Hours"]
    assert sorted((r["x_ClusterName"], r["BilledCost"], r["ListUnitPrice"]) for r in gpu) == sorted(
        [(home, "3.00", "3"), ("site-b", "5.00", "5"), ("site-c", "2.00", "2")]
    )


# --- the cards: chains per (flavor, cluster), the API, the guards --------------------------


def test_a_clusters_chain_is_apart_from_the_defaults(org: Org) -> None:
    pat = org.users["pat"]
    site_b = Cluster.objects.create(name="site-b", backend="simulated")
    rate_card_add(user=pat, flavor=org.h100, valid_from=EARLY, prices=RatePrices(Decimal(2)))
    # The same start and an open end on site-b's chain: no overlap with the default's.
    first = rate_card_add(
        user=pat, flavor=org.h100, cluster=site_b, valid_from=EARLY, prices=RatePrices(Decimal(5))
    )
    later = rate_card_add(
        user=pat, flavor=org.h100, cluster=site_b, valid_from=at(100), prices=RatePrices(Decimal(6))
    )
    first.refresh_from_db()
    assert first.valid_to == at(100)
    assert RateCard.objects.get(cluster=None).valid_to is None  # the default left open
    rate_card_withdraw(user=pat, rate_card=later, now=at(0))
    first.refresh_from_db()
    assert first.valid_to is None


def test_the_database_keeps_one_open_version_per_flavor_and_cluster(org: Org) -> None:
    site_b = Cluster.objects.create(name="site-b", backend="simulated")
    RateCard.objects.create(flavor=org.h100, valid_from=EARLY, currency="EUR", gpu_hour=2)
    RateCard.objects.create(
        flavor=org.h100, cluster=site_b, valid_from=EARLY, currency="EUR", gpu_hour=5
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        RateCard.objects.create(
            flavor=org.h100, cluster=site_b, valid_from=at(5), currency="EUR", gpu_hour=6
        )
    with pytest.raises(IntegrityError), transaction.atomic():
        RateCard.objects.create(flavor=org.h100, valid_from=EARLY, currency="EUR", gpu_hour=3)
    assert RateCard.objects.count() == 2


def test_a_used_cards_cluster_cannot_be_changed(org: Org) -> None:
    installation(org)
    card = RateCard.objects.get(cluster__name="site-b")
    with pytest.raises(IntegrityError), transaction.atomic():
        RateCard.objects.filter(pk=card.pk).update(cluster=None)
    assert RateCard.objects.get(pk=card.pk).cluster is not None


def test_the_api_takes_and_shows_the_cluster_and_audits_it(org: Org, client_for: Any) -> None:
    Cluster.objects.create(name="site-b", backend="simulated")
    client = client_for("pat")
    body = {"flavor": org.h100.pk, "valid_from": EARLY.isoformat(), "gpu_hour": "5.00"}
    response = client.post(URL, {**body, "cluster": "site-b"}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["cluster"] == "site-b"
    default = client.post(URL, body, format="json")
    assert default.status_code == 201 and default.json()["cluster"] is None
    listed = client.get(URL, {"cluster": Cluster.objects.get(name="site-b").pk}).json()
    assert [c["cluster"] for c in listed["results"]] == ["site-b"]
    entry = AuditEntry.objects.filter(action="rate_card.add").order_by("id").first()
    assert entry is not None and entry.after is not None
    assert entry.after["cluster"] == Cluster.objects.get(name="site-b").pk


@pytest.mark.parametrize(
    ("extra", "field", "says"),
    [
        pytest.param({"cluster": "nowhere"}, "cluster", "no cluster named nowhere", id="unknown"),
        pytest.param({"cluster": 7}, "cluster", "must be a string", id="not-a-name"),
        pytest.param(
            {"cluster": "site-b"},
            "valid_from",
            "overlaps version",
            id="overlaps-its-chain",
        ),
    ],
)
def test_a_bad_cluster_card_is_a_400_that_changes_nothing(
    org: Org, client_for: Any, extra: dict[str, Any], field: str, says: str
) -> None:
    Cluster.objects.create(name="site-b", backend="simulated")
    client = client_for("pat")
    body = {"flavor": org.h100.pk, "valid_from": EARLY.isoformat(), "gpu_hour": "5.00"}
    assert client.post(URL, {**body, "cluster": "site-b"}, format="json").status_code == 201
    before = list(RateCard.objects.values_list("id", "valid_to"))
    response = client.post(URL, {**body, **extra}, format="json")
    assert response.status_code == 400
    assert says in " ".join(response.json()["errors"][field])
    assert list(RateCard.objects.values_list("id", "valid_to")) == before
