"""Allocated but idle (issue 18, from issue 20's samples): GPU-hours held under the idle
threshold, priced at list rate, shown back and never charged; both reconciliations hold.

The cluster of tests/billing/test_statements.py: alice holds device 0 of n1 for hours 0-3 at
2.00 a GPU-hour (3.00 from hour 2 on)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from fractions import Fraction

from billing.models import StatementLine
from billing.statements.closing import statement_close
from billing.statements.reconciliation import cluster_reconciliation
from billing.statements.rollup import organisation_lines, roll_up
from scheduler.models import GpuDevice, Job, UtilizationSample
from scheduler.telemetry.rollups import LAG, rollup_run
from tests.billing.builders import T0, at
from tests.billing.test_statements import cluster
from tests.conftest import Org


def feed(job: Job, start_h: float, minutes: int, util: float) -> None:
    """Samples every 30 s of device 0 of n1 for `minutes` from hour `start_h`, attributed to
    `job` (as ingest did while it held the device)."""
    device = GpuDevice.objects.get(node__name="n1", index=0)
    UtilizationSample.objects.bulk_create(
        UtilizationSample(
            at=at(start_h) + timedelta(seconds=30 * i),
            device=device,
            flavor="H100-80GB",
            utilization_pct=util,
            job=job,
            tenant_id=job.tenant_id,
            project_id=job.project_id,
            share_milli=1000,
        )
        for i in range(minutes * 2)
    )


def alice_job(org: Org) -> Job:
    return Job.objects.get(submitted_by=org.users["alice"], allocations__node__name="n1")


def test_allocated_but_idle_worked_out_shown_back_and_both_reconciliations_hold(
    org: Org,
) -> None:
    cluster(org)
    before = organisation_lines(org.acme, T0, at(4))
    assert not [d for d in before if d.line.kind == "allocated-idle"]  # no samples: nothing
    job = alice_job(org)
    feed(job, 0, 30, 2.0)  # hour 0: idle for 30 minutes (under 5 %)...
    feed(job, 0.5, 30, 60.0)  # ...then busy
    feed(job, 2, 20, 0.0)  # hour 2: idle for 20 minutes, then no samples
    while rollup_run(now=at(4) + LAG):
        pass
    lines = organisation_lines(org.acme, T0, at(4))
    idle = {(d.line.rate, d.line.exact, d.line.amount, d.charged) for d in lines
            if d.line.kind == "allocated-idle"}  # fmt: skip
    # Hour 0: 60 samples x 30 s = 0.5 GPU-hour x 2.00 = 1.00; hour 2: 40 x 30 s = 1/3
    # GPU-hour x 3.00 = 1.00. Both shown, neither charged.
    assert idle == {
        (Decimal("2"), Fraction(1, 2), Decimal("1.00"), False),
        (Decimal("3"), Fraction(1, 3), Decimal("1.00"), False),
    }
    [account] = {d.line.account for d in lines if d.line.kind == "allocated-idle"}
    assert account == (org.alpha.pk, org.proj_alpha.pk, org.users["alice"].pk)
    # The charged lines are those without the samples, to the cent.
    assert [d for d in lines if d.charged] == [d for d in before if d.charged]
    # 1. The leaves add up to the root, charged and shown back alike.
    totals = roll_up((d.line.account[0], d.line.amount, d.charged) for d in lines)
    assert totals[org.acme.pk].charged == sum(
        (d.line.amount for d in lines if d.charged), Decimal(0)
    )
    showback = sum((d.line.amount for d in lines if not d.charged), Decimal(0))
    assert totals[org.acme.pk].showback == showback
    shown_before = roll_up((d.line.account[0], d.line.amount, d.charged) for d in before)
    assert totals[org.acme.pk].showback == shown_before[org.acme.pk].showback + Decimal("2.00")
    # 2. The cluster: used is what the used, preempted and failed lines metered (the idle
    # GPU time is inside it, not beside it).
    [h100] = cluster_reconciliation(T0, at(4))
    assert h100.reconciled
    metered = sum((d.line.exact for d in lines
                   if d.line.resource == "gpu" and d.line.kind in ("used", "preempted", "failed")),
                  Fraction(0))  # fmt: skip
    assert h100.gpu_hours["used"] == metered


def test_closing_keeps_the_allocated_idle_lines_as_showback(org: Org) -> None:
    cluster(org)
    feed(alice_job(org), 1, 60, 1.0)  # hour 1 idle throughout: 1 GPU-hour x 2.00
    while rollup_run(now=at(4) + LAG):
        pass
    statement = statement_close(
        user=org.users["pat"], organisation=org.acme, start=T0, end=at(4), now=at(5)
    )
    line = StatementLine.objects.get(statement=statement, kind="allocated-idle")
    assert (line.quantity, line.amount, line.charged, line.unit) == (
        Decimal("1"),
        Decimal("2.00"),
        False,
        "GPU-hour",
    )
