"""`gantry quotas` names the cluster a quota is pinned to (issue 38)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler.models import Cluster
from tenants import services
from tenants.quotas.rules import QuotaValues
from tests.cli.test_cli import gantry, logged_in
from tests.conftest import Org

__all__ = ["gantry", "logged_in"]

pytestmark = pytest.mark.django_db(transaction=True)


def test_quotas_show_the_cluster_a_quota_is_pinned_to(logged_in: Any, org: Org) -> None:
    site_b = Cluster.objects.create(name="site-b", backend="simulated")
    services.quota_set(
        user=org.users["pat"],
        tenant=org.alpha,
        flavor=org.h100,
        values=QuotaValues(4000, 8000, None, 1.0),
        cluster=site_b,
    )
    code, out, err = logged_in("--json", "quotas", "--tenant", str(org.alpha.pk))
    assert code == 0, err
    shown = sorted((q["cluster"], q["guaranteed"], q["limit"]) for q in json.loads(out))
    assert shown == [("(all)", 16.0, 32.0), ("site-b", 4.0, 8.0)]
    code, table, _ = logged_in("quotas", "--tenant", str(org.alpha.pk))
    assert code == 0 and "site-b" in table and "(all)" in table
