"""Allocated-but-idle showback per cluster (issue 38): each line names the cluster its job's
allocations held (their node's, as UsageRecord.cluster) and is priced at that cluster's card;
statements, their API, the CSV/XLSX exports and FOCUS rows carry it as they do the used lines.

The installation of tests/billing/test_rates_per_cluster.py: the home cluster (its own card,
3.00 a GPU-hour), site-b (5.00) and site-c (the default card, 2.00); one job of team-alpha on
each, one device for hour 0, metered. Each job's device reads idle (under 5 %) for the first
30 minutes of hour 0: half a GPU-hour idle on each cluster.
"""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

import openpyxl

from billing.metering.hourly import meter_usage
from billing.metering.idle import clusters_of
from billing.models import StatementLine
from billing.rates.cards import RatePrices, rate_card_add
from billing.statements.closing import statement_close
from billing.statements.rollup import organisation_lines, roll_up
from scheduler.models import Allocation, Cluster, GpuDevice, Job, Node
from scheduler.telemetry.rollups import LAG, rollup_run
from tests.billing.builders import T0, at, hold, job_for, make_node
from tests.billing.test_rates_per_cluster import EARLY, EXPORT, WINDOW, installation
from tests.conftest import Org


def feed(job: Job, node: Node, start_h: float, minutes: int, util: float = 1.0) -> None:
    """Samples every 30 s of `node`'s device 0 for `minutes` from hour `start_h`, attributed
    to `job` (as ingest does while the job holds the device)."""
    from scheduler.models import UtilizationSample

    device = GpuDevice.objects.get(node=node, index=0)
    UtilizationSample.objects.bulk_create(
        UtilizationSample(
            at=at(start_h) + timedelta(seconds=30 * i),
            device=device,
            flavor=node.flavor,
            utilization_pct=util,
            job=job,
            tenant_id=job.tenant_id,
            project_id=job.project_id,
            share_milli=1000,
        )
        for i in range(minutes * 2)
    )


def roll() -> None:
    while rollup_run(now=at(4) + LAG):
        pass


def idle_on_each(org: Org) -> dict[str, Cluster]:
    """The installation, each job idle for the first 30 minutes of hour 0, rolled up."""
    clusters = installation(org)
    for allocation in Allocation.objects.select_related("job", "node"):
        feed(allocation.job, allocation.node, 0, 30)
    roll()
    return clusters


def allocated_idle(lines: list[Any]) -> dict[str, tuple[Decimal, Fraction, Decimal, bool]]:
    """cluster -> (rate, GPU-hours, amount, charged) of the allocated-idle lines."""
    out = {}
    for draft in lines:
        line = draft.line
        if line.kind == "allocated-idle":
            assert line.cluster not in out
            out[line.cluster] = (line.rate, line.exact, line.amount, draft.charged)
    return out


def test_each_clusters_idle_time_is_priced_at_its_card_and_names_it(org: Org) -> None:
    home = idle_on_each(org)["home"].name
    lines = organisation_lines(org.acme, at(0), at(1))
    half = Fraction(1, 2)
    # Half a GPU-hour on each: home 0.5 x 3.00, site-b 0.5 x 5.00, site-c 0.5 x 2.00 (the
    # default card); shown back, never charged.
    assert allocated_idle(lines) == {
        home: (Decimal(3), half, Decimal("1.50"), False),
        "site-b": (Decimal(5), half, Decimal("2.50"), False),
        "site-c": (Decimal(2), half, Decimal("1.00"), False),
    }
    totals = roll_up((d.line.account[0], d.line.amount, d.charged) for d in lines)
    assert totals[org.acme.pk].showback == Decimal("5.00")
    assert totals[org.acme.pk].charged == Decimal("10.00")  # the used lines: 3 + 5 + 2


def test_statements_their_api_and_exports_name_the_cluster_of_idle_lines(
    org: Org, client_for: Any
) -> None:
    home = idle_on_each(org)["home"].name
    expected = {(home, "1.50"), ("site-b", "2.50"), ("site-c", "1.00")}
    statement = statement_close(
        user=org.users["carol"], organisation=org.acme, start=at(0), end=at(1), now=at(5)
    )
    stored = StatementLine.objects.filter(statement=statement, kind="allocated-idle")
    assert {(c, str(a)) for c, a in stored.values_list("cluster", "amount")} == expected
    assert not any(stored.values_list("charged", flat=True))
    carol = client_for("carol")
    page = carol.get(f"/api/v1/statements/{statement.pk}/lines/").json()
    assert {
        (r["cluster"], r["amount"]) for r in page["results"] if r["kind"] == "allocated-idle"
    } == expected
    params = {**WINDOW, "kind": "allocated-idle"}
    response = carol.get(EXPORT, {**params, "format": "csv", "by": "team"})
    assert response.status_code == 200
    data = b"".join(response.streaming_content).decode("utf-8-sig")
    *rows, total = csv.DictReader(io.StringIO(data))
    assert {(r["team"], r["cluster"], r["showback_EUR"]) for r in rows} == {
        ("team-alpha", cluster, amount) for cluster, amount in expected
    }
    assert (total["showback_EUR"], total["charged_EUR"]) == ("5.00", "0.00")
    response = carol.get(EXPORT, {**params, "format": "xlsx", "by": "team"})
    sheet = openpyxl.load_workbook(io.BytesIO(b"".join(response.streaming_content))).active
    header, *cells, _total = list(sheet.iter_rows(values_only=True))
    assert header[4:7] == ("cluster", "Charged", "Showback")
    assert {(r[4], f"{float(r[6]):.2f}") for r in cells} == expected
    response = carol.get(EXPORT, {**params, "format": "focus"})
    focus = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert {(r["x_ClusterName"], r["ListUnitPrice"], r["BilledCost"]) for r in focus} == {
        (home, "3", "0.00"),
        ("site-b", "5", "0.00"),
        ("site-c", "2", "0.00"),
    }


def test_an_hour_on_two_clusters_divides_its_idle_time_by_the_gpu_time_held(org: Org) -> None:
    """A job moved off home to site-b half-way through hour 0 (a lost cluster's job requeued),
    idle throughout: half its idle time on each, each at its card."""
    pat = org.users["pat"]
    home = Cluster.objects.get(home=True)
    site_b = Cluster.objects.create(name="site-b", backend="simulated")
    rate_card_add(user=pat, flavor=org.h100, valid_from=EARLY, prices=RatePrices(Decimal(2)))
    rate_card_add(
        user=pat, flavor=org.h100, cluster=site_b, valid_from=EARLY, prices=RatePrices(Decimal(5))
    )
    on_home = make_node("n1", gpus=1)
    on_b = make_node("site-b:n1", gpus=1)
    on_b.cluster = site_b
    on_b.save(update_fields=["cluster"])
    job = job_for(org)
    hold(job, on_home, 0, 0.5, [1000], attempt=1)
    hold(job, on_b, 0.5, 1, [1000], attempt=2)
    assert meter_usage(now=at(2)) == 1
    feed(job, on_home, 0, 30)
    feed(job, on_b, 0.5, 30)
    roll()
    # One roll-up row: the job's hour, 1 GPU-hour idle; 0.5 on each cluster.
    # home (the default card) 0.5 x 2.00 = 1.00; site-b 0.5 x 5.00 = 2.50.
    half = Fraction(1, 2)
    assert allocated_idle(organisation_lines(org.acme, at(0), at(1))) == {
        home.name: (Decimal(2), half, Decimal("1.00"), False),
        "site-b": (Decimal(5), half, Decimal("2.50"), False),
    }


def test_clusters_of_an_hour() -> None:
    """The clusters' shares of an hour: by GPU time held, by time alone where no GPU was
    held, and no cluster ("") where nothing was held."""
    span = timedelta(minutes=15)
    spans = [
        ("a", T0 - span, T0 + span, 1000),  # 15 minutes of the hour, one GPU
        ("b", T0 + span, None, 500),  # 45 minutes, half a GPU
        ("c", T0 + 4 * span, None, 1000),  # after the hour
    ]
    # a: 1000 x 15 = 15000; b: 500 x 45 = 22500: 2/5 and 3/5
    assert clusters_of(spans, T0) == {"a": Fraction(2, 5), "b": Fraction(3, 5)}
    assert clusters_of([("a", T0, None, 0), ("b", T0 + 2 * span, None, 0)], T0) == {
        "a": Fraction(2, 3),
        "b": Fraction(1, 3),
    }
    assert clusters_of(spans[2:], T0) == {"": Fraction(1)}


def test_a_single_cluster_keeps_its_totals_under_its_name(org: Org, client_for: Any) -> None:
    """One cluster, no card of its own: the idle lines are those of before (the default
    card's prices: the worked example of tests/billing/test_idle_usage.py, 0.5 GPU-hour x
    2.00), under the home cluster's name, and the exports keep one row per group."""
    rate_card_add(
        user=org.users["pat"], flavor=org.h100, valid_from=EARLY, prices=RatePrices(Decimal(2))
    )
    node = make_node("n1", gpus=1)
    job = job_for(org)
    hold(job, node, 0, 1, [1000])
    assert meter_usage(now=at(2)) == 1
    feed(job, node, 0, 30)
    roll()
    home = Cluster.objects.get(home=True).name
    lines = organisation_lines(org.acme, at(0), at(1))
    assert allocated_idle(lines) == {home: (Decimal(2), Fraction(1, 2), Decimal("1.00"), False)}
    totals = roll_up((d.line.account[0], d.line.amount, d.charged) for d in lines)
    assert (totals[org.acme.pk].charged, totals[org.acme.pk].showback) == (
        Decimal("2.00"),
        Decimal("1.00"),
    )
    response = client_for("carol").get(EXPORT, {**WINDOW, "format": "csv", "by": "team"})
    data = b"".join(response.streaming_content).decode("utf-8-sig")
    *rows, _total = csv.DictReader(io.StringIO(data))
    assert [(r["team"], r["cluster"], r["charged_EUR"], r["showback_EUR"]) for r in rows] == [
        ("team-alpha", home, "2.00", "1.00")
    ]
