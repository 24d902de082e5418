"""Quotes per cluster (issue 38): a job whose placement requires clusters is quoted at those
clusters' cards (each one's own, else the default card); any other job at the default card,
the quote saying which clusters' own cards apply if it is placed there.

Cards (H100, a GPU-hour): the default 2.00; site-b (region eu) its own 5.00; site-c (region
us) none. The job: 1 replica of 2 GPUs, no CPU or memory price, 1 h declared, 2 h at most.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from billing.rates.cards import RatePrices, rate_card_add
from scheduler.models import Cluster
from tests.conftest import Org, job_spec

QUOTES = "/api/v1/quotes/"


@pytest.fixture
def cards(org: Org, settings: Any) -> None:
    settings.GANTRY_REFUSE_BEYOND_INVENTORY = False  # no nodes: prices only
    start = datetime(2020, 1, 1, tzinfo=UTC)
    site_b = Cluster.objects.create(name="site-b", backend="simulated", labels={"region": "eu"})
    Cluster.objects.create(name="site-c", backend="simulated", labels={"region": "us"})
    pat = org.users["pat"]
    rate_card_add(user=pat, flavor=org.h100, valid_from=start, prices=RatePrices(Decimal(2)))
    rate_card_add(
        user=pat, flavor=org.h100, cluster=site_b, valid_from=start, prices=RatePrices(Decimal(5))
    )


def estimate(org: Org, client: Any, **placement: Any) -> dict[str, Any]:
    spec = job_spec(
        replicas=1,
        max_runtime_s=7200,
        estimated_runtime_s=3600,
        resources={"gpus": 2, "cpu_milli": 1000, "memory_mib": 1024},
        **({"placement": placement} if placement else {}),
    )
    response = client.post(QUOTES, {"project": org.proj_alpha.pk, "spec": spec}, format="json")
    assert response.status_code == 200, response.json()
    return dict(response.json()["estimate"])


def test_a_job_anywhere_is_quoted_at_the_default_card_and_says_so(
    org: Org, cards: None, client_for: Any
) -> None:
    e = estimate(org, client_for("alice"))
    # 2 GPUs x 2.00 = 4.00 an hour: 1 h low, 2 h high
    assert (e["per_hour_low"], e["low"], e["high"]) == ("4.00", "4.00", "8.00")
    assert e["flavors"] == [{"flavor": "H100-80GB", "cluster": None, "per_hour": "4.00"}]
    assert e["cards_note"] == (
        "Priced at the default card; the card of cluster site-b applies if placed there."
    )


def test_a_job_that_requires_a_cluster_is_quoted_at_its_card(
    org: Org, cards: None, client_for: Any
) -> None:
    e = estimate(org, client_for("alice"), clusters=["site-b"])
    # 2 GPUs x 5.00 = 10.00 an hour
    assert (e["per_hour_low"], e["low"], e["high"]) == ("10.00", "10.00", "20.00")
    assert e["flavors"] == [{"flavor": "H100-80GB", "cluster": "site-b", "per_hour": "10.00"}]
    assert e["cards_note"] == "Priced at site-b's card: the job must run there."


def test_a_cluster_without_its_own_card_is_quoted_at_the_default_one(
    org: Org, cards: None, client_for: Any
) -> None:
    e = estimate(org, client_for("alice"), regions=["us"])  # site-c only
    assert (e["per_hour_low"], e["per_hour_high"]) == ("4.00", "4.00")
    assert e["cards_note"] == "Priced at the default card (site-c): the job must run there."


def test_several_required_clusters_span_their_cards(org: Org, cards: None, client_for: Any) -> None:
    e = estimate(org, client_for("alice"), clusters=["site-b", "site-c"])
    # low: site-c at the default 4.00 for 1 h; high: site-b 10.00 for 2 h
    assert (e["low"], e["high"]) == ("4.00", "20.00")
    assert [(f["cluster"], f["per_hour"]) for f in e["flavors"]] == [
        ("site-c", "4.00"),
        ("site-b", "10.00"),
    ]


def test_the_portal_quote_shows_which_card(org: Org, cards: None) -> None:
    from django.template.loader import render_to_string

    from billing.costs.quotes import job_quote

    payload = job_spec(replicas=1, placement={"clusters": ["site-b"]})
    quote = job_quote(user=org.users["alice"], project=org.proj_alpha, payload=payload)
    html = render_to_string("portal/jobs/_quote.html", {"quote": quote.as_json()})
    assert "Priced at site-b&#x27;s card: the job must run there." in html
