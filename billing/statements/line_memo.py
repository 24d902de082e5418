"""The rated lines of hours no statement has closed, kept under a key of everything they are
rated from, so that cost pages do not rate the open month again at every request.

`statements.organisation_lines` is a function of what it reads: the usage, capacity and
guarantee records of the metered hours (written with the hour's MeteringPeriod row, never
changed; late usage adds records to an hour, and to its count: billing/metering/late.py), the
rate cards in force, the organisation's billing policy, the hourly utilization roll-ups of
its jobs, and the job events that end an attempt (an attempt's
usage is used, preempted or failed by how it ended: billing/metering/attempts.py). It also reads the
tenant tree, which no service moves (a tenant's path is set once, at its creation), and the
GPU inventory, which only tells it which devices to read sums of (a device that ever held a
share cannot be deleted). `inputs_key` reads a fingerprint of the others: five small
queries, a few milliseconds where rating the open month takes about a second. The cluster's
reconciliation (billing/statements/reconciliation.py: the hour splits at list price) is kept the
same way under `reconciliation_key`: it reads only the metered hours' records and the rates. The
same fingerprint, the same lines; any change, a new key, and the next reader rates them again
(tests/billing/test_line_memo.py changes each input in turn).

The ending events are the input that changes most: every job that ends writes one. Only
those that can reclassify metered usage count here: an ending to preempted or failed (or back
to the queue, a failed attempt) at or after the window's start, of a job with an attempt that
started before the last metered hour ended. An attempt that succeeds or is cancelled is rated
as a running one is (used), and a job that starts and ends between two meterings held nothing
metered, so neither empties the memo: on a busy cluster, only preemptions and failures of
long-running jobs do. (An attempt's ending is its first event out of a holding state, and
events are written in time order, so a later success cannot displace an earlier failure.)

The lines live in the default cache (Redis where there is one: shared by the web server's
processes), as plain tuples; a cache that is down or evicted only costs a rating.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar, cast

from django.core.cache import cache
from django.db.models import Count, Exists, Max, OuterRef, Sum

from billing.metering.attempts import ENDING, UsageKind
from billing.models import BillingPolicy, MeteringPeriod
from billing.statements.rollup import rates_between
from scheduler.jobs.lifecycle import HOLDING_STATES
from scheduler.models import Allocation, JobEvent
from scheduler.models.utilization import RollupPeriod, RollupScope, UtilizationRollup
from tenants.models import Tenant

T = TypeVar("T")
K = TypeVar("K")  # what the cache keeps: plain values, pickled

# The endings that make an attempt's usage other than used (preempted, failed): an attempt
# that succeeds or is cancelled is rated as one still running is, so its ending changes no line.
_RECLASSIFY = [state for state, kind in ENDING.items() if kind != UsageKind.USED]

# Raise it when the rating makes other lines from the same inputs: older entries are ignored.
VERSION = 4
# Each metered hour makes a new key, so an entry is dead within the hour on a running
# cluster: two hours bound what dead entries hold (a month's lines of a large organisation
# are megabytes), and a quiet one is rated again after that.
TIMEOUT_S = 2 * 3600

# One cost line as kept (billing/costs/lines.py makes and reads them): plain values, no objects.
Row = tuple[Any, ...]


def inputs_key(organisation: Tenant, start: datetime, end: datetime) -> str | None:
    """The cache key of the organisation's rated lines of [start, end): the window and a
    digest of everything the rating reads (see the module's docstring). None when no hour
    of the window is metered: rating it reads as little as the key would."""
    periods = _periods(start, end)
    if not periods["n"]:
        return None
    until = periods["until"] or start
    endings = (
        JobEvent.objects.filter(
            at__gte=start, from_state__in=HOLDING_STATES, to_state__in=_RECLASSIFY
        )
        .filter(Exists(Allocation.objects.filter(job_id=OuterRef("job_id"), started_at__lt=until)))
        .aggregate(n=Count("id"), last=Max("id"))
    )
    rollups = UtilizationRollup.objects.filter(
        period=RollupPeriod.HOUR,
        scope=RollupScope.JOB,
        start__gte=start,
        start__lt=end,
        tenant__path__startswith=organisation.path,
    ).aggregate(n=Count("id"), last=Max("id"), idle=Sum("idle_gpu_seconds"))
    policy = BillingPolicy.objects.filter(organisation=organisation).values_list(
        "idle_policy", flat=True
    )
    inputs = (periods, endings, rollups, _rates(start, end), list(policy))
    return _key(f"lines:{organisation.pk}", start, end, inputs)


def reconciliation_key(start: datetime, end: datetime) -> str | None:
    """The cache key of the cluster's reconciliation of [start, end)
    (billing/statements/reconciliation.py): it reads the metered hours' records (never changed once
    written) and the rates in force (list prices) alone. None when no hour is metered."""
    periods = _periods(start, end)
    if not periods["n"]:
        return None
    return _key("cluster", start, end, (periods, _rates(start, end)))


def _periods(start: datetime, end: datetime) -> dict[str, Any]:
    # `records`: late usage (billing/metering/late.py) adds records to hours metered already,
    # and their counts with them.
    return MeteringPeriod.objects.filter(start__gte=start, start__lt=end).aggregate(
        n=Count("id"), last=Max("id"), until=Max("end"), records=Sum("records")
    )


def _rates(start: datetime, end: datetime) -> list[tuple[Any, ...]]:
    return sorted(
        (
            rate.flavor,
            rate.valid_from,
            rate.valid_to,
            rate.gpu_hour,
            rate.cpu_core_hour,
            rate.memory_gib_hour,
            rate.borrowed_discount,
            sorted(rate.multipliers.items()),
            rate.cluster,
        )
        for rate in rates_between(start, end)
    )


def _key(what: str, start: datetime, end: datetime, inputs: Any) -> str:
    digest = hashlib.sha256(repr(inputs).encode()).hexdigest()[:32]
    return f"billing:{what}:{VERSION}:{start:%Y%m%d%H}:{end:%Y%m%d%H}:{digest}"


# The lines last built from kept rows, in this process: key -> lines (immutable, shared).
_built: OrderedDict[str, Any] = OrderedDict()
BUILT_KEPT = 16


def remembered(key: str | None, rate: Callable[[], K], build: Callable[[K], T]) -> T:
    """`build` of the rows kept under `key`, or of `rate()`'s, kept there for the next
    reader (no key: rated, not kept). What `build` makes of a key is kept in this process
    too (the last BUILT_KEPT keys): it must not be changed by its callers."""
    if key is None:
        return build(rate())
    if key in _built:
        _built.move_to_end(key)
        return cast(T, _built[key])
    rows = cache.get(key)
    if rows is None:
        rows = rate()
        cache.set(key, rows, TIMEOUT_S)
    built = _built[key] = build(rows)
    while len(_built) > BUILT_KEPT:
        _built.popitem(last=False)
    return built


def forget_built() -> None:
    """Empty this process's built lines (tests that clear the cache clear these too)."""
    _built.clear()
