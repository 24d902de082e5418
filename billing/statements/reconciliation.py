"""The two reconciliations, checked by tests and shown to finance.

1. The statement: every node's total is the sum of its subtree's rounded lines, so the leaves
   add up to the root to the cent (`statements.roll_up`).
2. The cluster, per flavor, cluster (issue 38) and period: used + idle reserved + unreserved
   idle + unavailable = capacity, where capacity is each device's list price (the flavor's
   GPU-hour rate on the cluster's card, else the default card; no multiplier or discount)
   times the hours it was present. In milli-GPU-seconds the identity is exact for every hour
   (billing/metering/capacity.py). In money the capacity is rounded once and the four parts
   are apportioned by the largest remainder method so that they add up to it to the cent;
   each part is within a cent of its exact value. A cluster's idle reserved is the shares
   located on it (billing/metering/located.py), never more than its idle; a flavor's rows
   add up, part by part, to the one split of every cluster.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from fractions import Fraction

from billing.metering.capacity import DEVICE_HOUR, apportion
from billing.metering.splits import cluster_splits
from billing.statements import line_memo
from billing.statements.rollup import SplitsMemo, price_at, rates_between

PARTS = ("used", "idle_reserved", "unreserved_idle", "unavailable")


@dataclass(frozen=True)
class FlavorReconciliation:
    flavor: str
    # milli-GPU-seconds
    held: dict[str, Fraction]
    capacity_held: Fraction
    # money, at list price
    amounts: dict[str, Decimal]
    capacity: Decimal
    # The cluster's name (issue 38): a row per flavor and cluster.
    cluster: str = ""

    @property
    def gpu_hours(self) -> dict[str, Fraction]:
        return {part: value / DEVICE_HOUR for part, value in self.held.items()}

    @property
    def reconciled(self) -> bool:
        return (
            sum(self.held.values(), Fraction(0)) == self.capacity_held
            and sum(self.amounts.values(), Decimal(0)) == self.capacity
        )


def cluster_reconciliation_kept(
    start: datetime, end: datetime, *, splits: SplitsMemo | None = None
) -> list[FlavorReconciliation]:
    """`cluster_reconciliation`, kept under a key of what it reads
    (billing/statements/line_memo.py): the costs page shows it to finance at every request."""
    return line_memo.remembered(
        line_memo.reconciliation_key(start, end),
        lambda: cluster_reconciliation(start, end, splits=splits),
        lambda rows: rows,
    )


def cluster_reconciliation(
    start: datetime, end: datetime, *, splits: SplitsMemo | None = None
) -> list[FlavorReconciliation]:
    """Per flavor and cluster, where its capacity went in the metered hours of [start,
    end), each cluster's at its card's list price. `splits`: the window's splits when the
    caller has them already (statements.SplitsMemo)."""
    if splits is None:
        splits = {}
    if (start, end) not in splits:
        splits[(start, end)] = cluster_splits(start, end)
    rates = rates_between(start, end)
    Row = tuple[str, str]  # flavor, cluster
    held: dict[Row, dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
    money: dict[Row, dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
    for (hour, flavor, cluster), split in sorted(splits[(start, end)].items()):
        if not split.capacity and not split.idle_reserved and not split.used:
            continue
        price = Fraction(price_at(rates, flavor, hour, cluster).gpu_hour) / DEVICE_HOUR
        values = {
            "used": split.used,
            "idle_reserved": split.idle_reserved_total,
            "unreserved_idle": split.unreserved,
            "unavailable": split.unavailable,
            "capacity": split.capacity,
        }
        for part, value in values.items():
            held[(flavor, cluster)][part] += value
            money[(flavor, cluster)][part] += value * price
    rows = []
    for flavor, cluster in sorted(held):
        total, parts = apportion([money[(flavor, cluster)][p] for p in PARTS])
        rows.append(
            FlavorReconciliation(
                flavor=flavor,
                held={p: held[(flavor, cluster)][p] for p in PARTS},
                capacity_held=held[(flavor, cluster)]["capacity"],
                amounts=dict(zip(PARTS, parts, strict=True)),
                capacity=total,
                cluster=cluster,
            )
        )
    return rows
