"""Idle reserved capacity and the cluster reconciliation per cluster (issue 38): metering
records each cluster's devices and the pinned guarantees; a pinned guarantee's idle share lies
on its cluster, a global one's over the clusters by their available devices
(billing/metering/located.py), each part priced at its cluster's card; statements, their API
and exports carry the cluster; a single cluster's totals are as before.

The installation: the home cluster (no card of its own: the default card, 2.00 a GPU-hour) and
site-b (its own card, 5.00), each with a node of H100s. Guarantees (GPUs): acme 3 > research 2
(team-alpha 2, of which 1 pinned to site-b), product 1 (team-charlie 1, global). Nothing runs
in hour 0. The flavor's split (billing/metering/capacity.py): idle 4 GPU-hours, unused top
guarantee 3, so 3 GPU-hours idle reserved: team-alpha 2, team-charlie 1.
"""

from __future__ import annotations

import csv
import importlib
import io
from decimal import Decimal
from fractions import Fraction
from typing import Any

from django.apps import apps

from billing.metering.capacity import DEVICE_HOUR
from billing.metering.hourly import meter_hour
from billing.metering.splits import cluster_splits, hour_splits
from billing.models import CapacityRecord, GuaranteeRecord, StatementLine
from billing.rates.cards import RatePrices, rate_card_add
from billing.statements.closing import statement_close
from billing.statements.reconciliation import cluster_reconciliation
from billing.statements.rollup import organisation_lines
from scheduler.models import Cluster
from tenants.models import Quota, Tenant
from tests.billing.builders import T0, at, make_node
from tests.conftest import Org

EARLY = T0.replace(day=1)
# Leaves first: a parent's guarantee must hold its children's at every step.
GUARANTEES = {"team-bravo": 0, "team-alpha": 2, "team-charlie": 1, "research": 2}
GUARANTEES |= {"product": 1, "acme": 3}
H = Fraction(DEVICE_HOUR)  # one GPU-hour in milli-GPU-seconds


def installation(
    org: Org, home_gpus: int = 2, site_b_gpus: int = 2, *, charlie_pinned: bool = False
) -> dict[str, Cluster]:
    """The installation of the module's docstring, hour 0 metered. `charlie_pinned`:
    team-charlie's 1 GPU is pinned to site-b instead, with no global quota."""
    pat = org.users["pat"]
    clusters = {
        "home": Cluster.objects.get(home=True),
        "site-b": Cluster.objects.create(name="site-b", backend="simulated"),
    }
    rate_card_add(user=pat, flavor=org.h100, valid_from=EARLY, prices=RatePrices(Decimal(2)))
    rate_card_add(
        user=pat,
        flavor=org.h100,
        cluster=clusters["site-b"],
        valid_from=EARLY,
        prices=RatePrices(Decimal(5)),
    )
    for slug, gpus in GUARANTEES.items():
        Quota.objects.filter(tenant__slug=slug, flavor=org.h100).update(
            guaranteed_milli=gpus * 1000
        )
    pins = [org.alpha, org.charlie] if charlie_pinned else [org.alpha]
    for tenant in pins:
        Quota.objects.create(
            tenant=tenant,
            flavor=org.h100,
            cluster=clusters["site-b"],
            guaranteed_milli=1000,
            limit_milli=1000,
        )
    if charlie_pinned:
        Quota.objects.filter(tenant=org.charlie, cluster=None).update(guaranteed_milli=0)
    for name, gpus in (("home", home_gpus), ("site-b", site_b_gpus)):
        node = make_node("n1" if name == "home" else "site-b:n1", gpus=gpus)
        node.cluster = clusters[name]
        node.save(update_fields=["cluster"])
    assert meter_hour(at(0), now=at(2))
    return clusters


def idle(lines: list[Any]) -> dict[tuple[str, str], tuple[Fraction, Decimal]]:
    """(tenant slug, cluster) -> (GPU-hours, amount) of the idle reserved lines."""
    slugs = dict(Tenant.objects.values_list("id", "slug"))
    out = {}
    for draft in lines:
        line = draft.line
        if line.kind == "idle-reserved":
            out[(slugs[line.account[0]], line.cluster)] = (line.exact, line.amount)
    return out


def test_metering_records_each_clusters_devices_and_the_pinned_guarantees(org: Org) -> None:
    home = installation(org)["home"].name
    records = {
        (r.flavor, r.cluster): (len(r.available), len(r.unavailable))
        for r in CapacityRecord.objects.all()
    }
    assert records == {("H100-80GB", home): (2, 0), ("H100-80GB", "site-b"): (2, 0)}
    guarantees = set(
        GuaranteeRecord.objects.filter(tenant=org.alpha).values_list("cluster", "guaranteed_milli")
    )
    assert guarantees == {("", 2000), ("site-b", 1000)}


def test_a_pinned_share_lies_on_its_cluster_and_a_global_one_follows_the_devices(
    org: Org,
) -> None:
    # team-alpha: pin 1000 on site-b, floating 2000 - 1000 = 1000 over 2 + 2 devices: 500
    # each. Located: home 500, site-b 1500; its 2 GPU-hours: home 0.5, site-b 1.5.
    # team-charlie: floating 1000: home 500, site-b 500; its 1 GPU-hour: 0.5 and 0.5.
    # Priced: home 2.00 (the default card), site-b 5.00 (its own).
    home = installation(org)["home"].name
    lines = organisation_lines(org.acme, at(0), at(1))
    half = Fraction(1, 2)
    assert idle(lines) == {
        ("team-alpha", home): (half, Decimal("1.00")),
        ("team-alpha", "site-b"): (3 * half, Decimal("7.50")),
        ("team-charlie", home): (half, Decimal("1.00")),
        ("team-charlie", "site-b"): (half, Decimal("2.50")),
    }


def test_the_reconciliation_is_per_flavor_and_cluster_at_each_clusters_card(org: Org) -> None:
    # home: 2 GPU-hours at 2.00 = 4.00, of which idle reserved 0.5 + 0.5 = 1 GPU-hour (2.00)
    # and unreserved idle 1 (2.00). site-b: 2 GPU-hours at 5.00 = 10.00, all idle reserved
    # (1.5 + 0.5).
    home = installation(org)["home"].name
    rows = {(row.flavor, row.cluster): row for row in cluster_reconciliation(at(0), at(1))}
    assert set(rows) == {("H100-80GB", home), ("H100-80GB", "site-b")}
    assert all(row.reconciled for row in rows.values())
    on_home, on_b = rows[("H100-80GB", home)], rows[("H100-80GB", "site-b")]
    assert (on_home.capacity, on_b.capacity) == (Decimal("4.00"), Decimal("10.00"))
    assert on_home.amounts == {
        "used": Decimal("0.00"),
        "idle_reserved": Decimal("2.00"),
        "unreserved_idle": Decimal("2.00"),
        "unavailable": Decimal("0.00"),
    }
    assert on_b.amounts["idle_reserved"] == Decimal("10.00")
    assert on_b.amounts["unreserved_idle"] == Decimal("0.00")


def test_a_cluster_never_holds_more_idle_reserved_than_it_had_idle(org: Org) -> None:
    # home 3 devices, site-b 1. team-alpha's floating 1000 over 3 + 1: 750 and 250, so
    # located home 750, site-b 1250: 0.75 and 1.25 GPU-hours; team-charlie 0.75 and 0.25.
    # site-b holds 1.5 but had 1 idle: a third of each share there moves to home (its room
    # 3 - 1.5): team-alpha keeps 5/6 on site-b and has 3/4 + 5/12 = 7/6 on home,
    # team-charlie 1/6 and 3/4 + 1/12 = 5/6. Each keeps its total (2 and 1).
    home = installation(org, home_gpus=3, site_b_gpus=1)["home"].name
    splits = cluster_splits(at(0), at(1))
    on_b, on_home = splits[(at(0), "H100-80GB", "site-b")], splits[(at(0), "H100-80GB", home)]
    assert on_b.idle_reserved == {org.alpha.pk: H * 5 / 6, org.charlie.pk: H / 6}
    assert on_home.idle_reserved == {org.alpha.pk: H * 7 / 6, org.charlie.pk: H * 5 / 6}
    assert (on_b.unreserved, on_home.unreserved) == (0, H)
    assert all(row.reconciled for row in cluster_reconciliation(at(0), at(1)))


def test_a_tenant_with_a_pin_and_no_global_quota_holds_its_pin(org: Org) -> None:
    # team-charlie: 1 GPU pinned to site-b, no global quota: it holds 1 GPU, as a global
    # quota of 1 would, so the flavor's split is as above (team-alpha 2, team-charlie 1),
    # and its share lies on site-b. site-b then holds 1.5 (team-alpha) + 1 = 2.5 GPU-hours
    # for an idle of 2: a fifth of each share there moves to home. team-alpha: site-b 1.2
    # (6.00), home 0.5 + 0.3 = 0.8 (1.60); team-charlie: site-b 0.8 (4.00), home 0.2 (0.40).
    home = installation(org, charlie_pinned=True)["home"].name
    assert idle(organisation_lines(org.acme, at(0), at(1))) == {
        ("team-alpha", home): (Fraction(4, 5), Decimal("1.60")),
        ("team-alpha", "site-b"): (Fraction(6, 5), Decimal("6.00")),
        ("team-charlie", home): (Fraction(1, 5), Decimal("0.40")),
        ("team-charlie", "site-b"): (Fraction(4, 5), Decimal("4.00")),
    }


def test_statements_their_api_and_exports_name_the_cluster_of_idle_reserved_lines(
    org: Org, client_for: Any
) -> None:
    home = installation(org)["home"].name
    statement = statement_close(
        user=org.users["carol"], organisation=org.acme, start=at(0), end=at(1), now=at(5)
    )
    stored = set(
        StatementLine.objects.filter(statement=statement, kind="idle-reserved").values_list(
            "tenant__slug", "cluster", "amount"
        )
    )
    assert stored == {
        ("team-alpha", home, Decimal("1.00")),
        ("team-alpha", "site-b", Decimal("7.50")),
        ("team-charlie", home, Decimal("1.00")),
        ("team-charlie", "site-b", Decimal("2.50")),
    }
    carol = client_for("carol")
    page = carol.get(f"/api/v1/statements/{statement.pk}/lines/").json()
    assert {(r["tenant_slug"], r["cluster"], r["amount"]) for r in page["results"]} == {
        (slug, cluster, str(amount)) for slug, cluster, amount in stored
    }
    response = carol.get(
        "/api/v1/costs/export/",
        {
            "format": "csv",
            "from": "2031-01-31T20:00:00Z",
            "to": "2031-01-31T21:00:00Z",
            "by": "team",
        },
    )
    assert response.status_code == 200
    rows = list(
        csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode("utf-8-sig")))
    )
    charged = next(key for key in rows[0] if key.startswith("charged_"))
    assert {(r["team"], r["cluster"], r[charged]) for r in rows if r["team"] != "Total"} == {
        ("team-alpha", home, "1.00"),
        ("team-alpha", "site-b", "7.50"),
        ("team-charlie", home, "1.00"),
        ("team-charlie", "site-b", "2.50"),
    }


def test_capacity_of_before_clusters_is_the_home_clusters(org: Org) -> None:
    """Migration 0019 names the home cluster on the rows metered before it; a row the
    release before writes during an upgrade ("") is read as the home cluster's too."""
    home = installation(org)["home"].name
    before = cluster_splits(at(0), at(1))
    CapacityRecord.objects.filter(cluster=home).update(cluster="")
    assert cluster_splits(at(0), at(1)) == before
    migration = importlib.import_module("billing.migrations.0019_capacity_guarantee_cluster")
    migration.home_cluster(apps, None)
    assert set(CapacityRecord.objects.values_list("cluster", flat=True)) == {home, "site-b"}


def test_one_clusters_splits_and_idle_totals_are_the_flavors_unchanged(org: Org) -> None:
    """A single-cluster installation: each hour's split on its cluster is the flavor's split
    (as before clusters), and each tenant's idle reserved lines are that split's shares at
    the default card, as they were."""
    rate_card_add(
        user=org.users["pat"], flavor=org.h100, valid_from=EARLY, prices=RatePrices(Decimal(2))
    )
    for slug, gpus in GUARANTEES.items():
        Quota.objects.filter(tenant__slug=slug, flavor=org.h100).update(
            guaranteed_milli=gpus * 1000
        )
    make_node("n1", gpus=3)
    assert meter_hour(at(0), now=at(2))
    home = Cluster.objects.get(home=True).name
    flavor_splits = hour_splits(at(0), at(1))
    assert cluster_splits(at(0), at(1)) == {
        (hour, flavor, home): split for (hour, flavor), split in flavor_splits.items()
    }
    # idle 3 GPU-hours, top unused 3: team-alpha 2, team-charlie 1, at 2.00
    assert idle(organisation_lines(org.acme, at(0), at(1))) == {
        ("team-alpha", home): (Fraction(2), Decimal("4.00")),
        ("team-charlie", home): (Fraction(1), Decimal("2.00")),
    }


def test_on_a_month_over_two_clusters_the_clusters_add_up_to_the_flavors_split(db: Any) -> None:
    """A small month of the billing benchmark (preemptions, failures, fractional shares,
    cordoned nodes) with every other node on site-b and the teams' guarantees half pinned
    there: for every hour and flavor, the clusters' parts add up exactly to the flavor's
    split, tenant by tenant, and no cluster holds more idle reserved than it had idle."""
    from bench.billing import build, meter, shape
    from scheduler.models import Node

    month = shape(16, 2, 300, 1)
    build(month)
    site_b = Cluster.objects.create(name="site-b", backend="simulated")
    for node in Node.objects.order_by("name")[1::2]:
        node.cluster = site_b
        node.save(update_fields=["cluster"])
    for quota in Quota.objects.filter(cluster=None, guaranteed_milli__gt=0, tenant__parent=None):
        Quota.objects.create(
            tenant=quota.tenant,
            flavor=quota.flavor,
            cluster=site_b,
            guaranteed_milli=quota.guaranteed_milli // 2,
            limit_milli=quota.limit_milli,
        )
    meter(month)
    whole = hour_splits(month.start, month.end)
    parts = cluster_splits(month.start, month.end)
    assert {cluster for (_, _, cluster) in parts} == {Cluster.objects.get(home=True).name, "site-b"}
    for (hour, flavor), split in whole.items():
        mine = [s for (h, f, _), s in parts.items() if (h, f) == (hour, flavor)]
        for name in ("capacity", "used", "unavailable", "unreserved"):
            assert sum((getattr(s, name) for s in mine), Fraction(0)) == getattr(split, name)
        shares: dict[int, Fraction] = {}
        for s in mine:
            assert s.unreserved >= 0
            for tenant, share in s.idle_reserved.items():
                shares[tenant] = shares.get(tenant, Fraction(0)) + share
        assert shares == dict(split.idle_reserved)
    assert any(s.idle_reserved for (_, _, c), s in parts.items() if c == "site-b")


def test_the_costs_page_reconciles_each_cluster_at_its_card(org: Org) -> None:
    from django.test import Client
    from django.urls import reverse

    home = installation(org)["home"].name
    client = Client()
    client.force_login(org.users["carol"])
    html = client.get(reverse("portal:costs"), {"month": "2031-01"}).content.decode()
    section = html.split('id="costs-reconciliation"')[1]
    # a row per GPU model and cluster, capacity last: 4.00 on home, 10.00 on site-b
    for cluster, capacity in ((home, "4.00"), ("site-b", "10.00")):
        row = section.split(f"<td>{cluster}</td>")[1].split("</tr>")[0]
        assert f'<td class="num">{capacity}</td>' in row, row
        assert ">OK<" in row
