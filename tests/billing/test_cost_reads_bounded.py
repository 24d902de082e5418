"""The cost API's reads do not grow with the organisations it rates (issue 21, load).

The hour splits (billing/metering/splits.py) are the whole cluster's: the idle reserved capacity of
every organisation comes from the same ones. Computed once per organisation, they made the
cost routes' work grow with the number of organisations; they are read once per window.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from billing.statements import line_memo
from billing.statements.rollup import organisation_lines
from tenants.models import TenantKind
from tests.billing.builders import T0, at
from tests.billing.test_costs_api import WINDOW
from tests.billing.test_statements import cluster
from tests.conftest import Org
from tests.factories import TenantFactory


def test_cluster_splits_read_once_for_every_organisation(org: Org, client_for: Any) -> None:
    cluster(org)
    for slug in ("globex", "initech", "umbrella"):
        TenantFactory(slug=slug, kind=TenantKind.ORGANISATION)
    client = client_for("carol")  # finance: every organisation
    client.get("/api/v1/costs/", {**WINDOW, "by": "team"})  # warm-up
    cache.clear()  # the warm-up's rated lines (billing/statements/line_memo.py): this request rates
    line_memo.forget_built()
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/api/v1/costs/", {**WINDOW, "by": "team"})
    assert response.status_code == 200, response.json()
    capacity_reads = [q for q in queries.captured_queries if "billing_capacityrecord" in q["sql"]]
    # The window's four hours are one slice of hours (statements.SLICE_HOURS): one read.
    assert len(capacity_reads) == 1
    # The shared splits give each organisation its own idle lines: the same total as rating
    # acme alone.
    acme = sum(
        (d.line.amount for d in organisation_lines(org.acme, T0, at(4)) if d.charged),
        Decimal("0.00"),
    )
    assert Decimal(response.json()["total"]["charged"]) == acme


def test_costs_page_splits_each_month_once(org: Org) -> None:
    """The finance page's lines and its cluster reconciliation read the same month's splits:
    once, not once for each."""
    cluster(org)
    client = Client()
    client.force_login(org.users["carol"])
    url = reverse("portal:costs")
    client.get(url, {"month": "2031-01"})  # warm-up
    cache.clear()  # the warm-up's rated lines (billing/statements/line_memo.py): this request rates
    line_memo.forget_built()
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, {"month": "2031-01"})
    assert response.status_code == 200
    assert "cluster" in response.context
    capacity_reads = [q for q in queries.captured_queries if "billing_capacityrecord" in q["sql"]]
    # Only January has metered hours, four of them: one slice, one read.
    assert len(capacity_reads) == 1
