"""The rate cards page (issue 38): every card's version chain, per flavor and per cluster or
the default card; finance and platform admins add a version through a form that goes the
API's way (the same serializer and service, audited), a bad input shown again with its
error; everyone signed in reads the prices, as the API lets them; the Costs page links it
for finance and platform admins."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from html import unescape
from typing import Any

import pytest
from django.urls import reverse

from billing.models import RateCard
from billing.rates.cards import RatePrices, rate_card_add
from scheduler.models import Cluster
from tenants.models import AuditEntry
from tests.conftest import Org

pytestmark = pytest.mark.django_db

START = datetime(2031, 1, 1, tzinfo=UTC)
URL = "/costs/rate-cards/"


@pytest.fixture
def cards(org: Org) -> Cluster:
    """The default H100 card (2.00, then 2.50 from February) and site-b's own (5.00)."""
    site_b = Cluster.objects.create(name="site-b", backend="simulated")
    pat = org.users["pat"]
    for start, price, cluster in [
        (START, "2.00", None),
        (START + timedelta(days=31), "2.50", None),
        (START, "5.00", site_b),
    ]:
        rate_card_add(
            user=pat,
            flavor=org.h100,
            cluster=cluster,
            valid_from=start,
            prices=RatePrices(Decimal(price)),
        )
    return site_b


def form(org: Org, **change: Any) -> dict[str, Any]:
    return {
        "flavor": org.h100.name,
        "cluster": "site-b",
        "valid_from": "2031-03-01T00:00",
        "valid_to": "",
        "gpu_hour": "6.00",
        "cpu_core_hour": "0",
        "memory_gib_hour": "0",
        "borrowed_discount": "0.25",
        "multiplier_critical": "1.5",
        **change,
    }


def test_the_page_lists_each_chain_with_its_versions(
    org: Org, cards: Cluster, web_for: Any
) -> None:
    assert reverse("portal:rate-cards") == URL
    html = web_for("alice").get(URL).content.decode()
    default = html.index("H100-80GB · default")
    own = html.index("H100-80GB · cluster site-b")
    assert default < own  # the default card first
    chain = html[default:own]
    assert "2031-01-01 00:00" in chain and "2031-02-01 00:00" in chain  # first version's end
    assert "2.000000" in chain and "2.500000" in chain and "open end" in chain
    assert "5.000000" in html[own:]


@pytest.mark.parametrize(
    ("persona", "edits"),
    [
        ("pat", True),  # platform admin
        ("carol", True),  # finance
        ("dana", False),  # department admin
        ("tina", False),  # team admin
        ("alice", False),  # member
    ],
)
def test_who_sees_the_page_and_who_adds_a_version(
    org: Org, cards: Cluster, web_for: Any, persona: str, edits: bool
) -> None:
    client = web_for(persona)
    page = client.get(URL)
    assert page.status_code == 200
    assert ('id="rate-card-form"' in page.content.decode()) is edits
    posted = client.post(URL, form(org))
    if not edits:
        assert posted.status_code == 403
        assert RateCard.objects.count() == 3
        return
    assert posted.status_code == 302 and posted["Location"] == URL
    card = RateCard.objects.get(cluster=cards, valid_from=datetime(2031, 3, 1, tzinfo=UTC))
    assert (card.gpu_hour, card.borrowed_discount) == (Decimal(6), Decimal("0.25"))
    assert {m.priority_class.name: m.multiplier for m in card.multipliers.all()} == {
        "critical": Decimal("1.5")
    }
    # appended to site-b's chain (its open end closed), audited under the person's name
    assert RateCard.objects.get(cluster=cards, valid_from=START).valid_to == card.valid_from
    entry = AuditEntry.objects.get(action="rate_card.add", target_id=str(card.pk))
    assert entry.actor_name == persona and entry.after["cluster"] == cards.pk
    assert "6.000000" in client.get(URL).content.decode()


def test_a_version_without_a_cluster_extends_the_default_card(
    org: Org, cards: Cluster, web_for: Any
) -> None:
    posted = web_for("carol").post(URL, form(org, cluster="", multiplier_critical=""))
    assert posted.status_code == 302
    card = RateCard.objects.get(valid_from=datetime(2031, 3, 1, tzinfo=UTC))
    assert card.cluster is None and not card.multipliers.exists()


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"gpu_hour": "cheap"}, "gpu_hour", 'must be a decimal number such as "2.50"'),
        ({"borrowed_discount": "1.5"}, "borrowed_discount", "must be at most 1."),
        ({"valid_from": "2031-03-01T00:30"}, "valid_from", "rates change on the hour"),
        ({"valid_from": "2030-12-15T00:00"}, "valid_from", "overlaps version"),
        ({"multiplier_critical": "-1"}, "multiplier_critical", "must not be negative."),
        ({"cluster": "nowhere"}, "cluster", "Select a valid choice."),
    ],
    ids=["not-a-price", "discount-above-1", "off-the-hour", "overlap", "negative-mult", "cluster"],
)
def test_a_bad_version_is_shown_again_with_its_error_and_changes_nothing(
    org: Org, cards: Cluster, web_for: Any, change: dict[str, str], field: str, message: str
) -> None:
    audited = AuditEntry.objects.count()
    answer = web_for("carol").post(URL, form(org, **change))
    assert answer.status_code == 400
    html = answer.content.decode()
    # the error inside the field's own block, and the input as posted kept in the form
    start = html.index(f'id="field-{field}"')
    block = unescape(html[start : html.index('<div class="field', start + 1)])
    assert message in block
    if field != "cluster":  # a select shows its choices; a text input what was typed
        assert f'value="{change[field]}"' in block
    assert RateCard.objects.count() == 3 and AuditEntry.objects.count() == audited


@pytest.mark.parametrize(("persona", "linked"), [("carol", True), ("pat", True), ("dana", False)])
def test_the_costs_page_links_the_rate_cards_for_finance_and_platform_admins(
    org: Org, web_for: Any, persona: str, linked: bool
) -> None:
    html = web_for(persona).get(reverse("portal:costs")).content.decode()
    assert (f'href="{URL}"' in html) is linked
