"""The finance page: cost per tenant for a month, and both reconciliations with OK/mismatch.

The cluster is tests/billing/test_statements.py's, metered over [T0, at(4)): January's last
four hours (T0 = 2031-01-31T20:00Z), so the month shown is 2031-01.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from billing.statements.rollup import organisation_lines, roll_up
from tests.billing.builders import T0, at
from tests.billing.test_statements import cluster
from tests.conftest import Org


def page(org: Org, username: str, **query: Any) -> Any:
    client = Client()
    client.force_login(org.users[username])
    return client.get(reverse("portal:costs"), {"month": "2031-01", **query})


def cells(html: str, tenant: str) -> list[str]:
    row = re.search(rf">{re.escape(tenant)}</th>(.*?)</tr>", html, re.S)
    assert row is not None, tenant
    return re.findall(r'<td class="num">([^<]*)</td>', row.group(1))


def test_finance_sees_every_tenant_and_both_identities_ok(org: Org) -> None:
    cluster(org)
    response = page(org, "carol")
    assert response.status_code == 200
    html = response.content.decode().split('id="costs-by-tenant"')[1]
    lines = organisation_lines(org.acme, T0, at(4))
    totals = roll_up((d.line.account[0], d.line.amount, d.charged) for d in lines)
    for tenant in [org.acme, org.research, org.alpha, org.bravo, org.product, org.charlie]:
        assert cells(html, tenant.slug)[0] == str(totals[tenant.pk].charged), tenant.slug
    section = html.split('id="costs-reconciliation"')[1]
    assert section.count(">OK<") == 2 and "mismatch" not in section  # acme; H100-80GB
    # The cluster: 6 devices x (2 h at 2.00 + 2 h at 3.00) = 60.00 (test_statements).
    assert cells(section, "H100-80GB")[-1] == "60.00"


def test_a_mismatch_is_shown_as_one(org: Org, monkeypatch: Any) -> None:
    from billing import selectors

    cluster(org)
    real = selectors.LeavesCheck
    monkeypatch.setattr(
        selectors,
        "LeavesCheck",
        lambda tenant, lines_sum, total: real(tenant, lines_sum + Decimal("0.01"), total),
    )
    section = page(org, "pat").content.decode().split('id="costs-reconciliation"')[1]
    assert "mismatch" in section


def test_a_tenant_admin_sees_their_subtree_without_the_cluster(org: Org) -> None:
    cluster(org)
    html = page(org, "dana").content.decode()
    assert "team-alpha" in html and "team-bravo" in html
    assert "charlie" not in html and "acme" not in html
    # The cluster's capacity is not a tenant's data (their own cost per flavor is).
    assert "H100-80GB" not in html.split('id="costs-reconciliation"')[1]


@pytest.mark.parametrize("username", ["alice", "chris"])
def test_members_are_refused(org: Org, username: str) -> None:
    assert page(org, username).status_code == 403


def test_a_foreign_tenant_filter_is_a_404_and_a_bad_month_a_400(org: Org) -> None:
    assert page(org, "tina", tenant=org.bravo.pk).status_code == 404
    response = page(org, "carol", month="2031-13")
    assert response.status_code == 400
    assert "not a month" in response.content.decode()


def test_the_finance_home_card_links_to_it(org: Org) -> None:
    client = Client()
    client.force_login(org.users["carol"])
    assert reverse("portal:costs") in client.get(reverse("portal:home")).content.decode()
