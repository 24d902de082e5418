"""The platform's promises, checked over the database's whole history after a run.

    python -m bench.chaos.checks [--pods FILE] [--submitted FILE] [--json out.json]

`run_checks` is what `bench.chaos` calls once its run has settled; by hand it checks any
database (DATABASE_URL, e.g. a copy of production's). Each count is zero when its promise
held (`PROMISES`); `jobs` and `not_settled` describe the run:

- `jobs`: the jobs in the database;
- `not_settled`: jobs not in a final state;
- `lost`: a submitted job (`submitted`, ids the caller was given) missing, or a job with no
  way forward: admitted, binding or running without an active allocation of its attempt, or
  preempted holding nothing (the daemon requeues such jobs within a cycle, so the count is
  meant for a history at rest: the run settled, or its daemons stopped);
- `double_allocations`: the instants a device's shares summed over 1,000 milli;
- `quota_breaches`: the instants a tenant's subtree held more of a flavor than its quota's
  limit, or a user of the tenant more than its cap per user (usage as the engine charges
  it: `scheduler.snapshot.quota_usage.held_claims`);
- `open_ended_allocations`: allocations that ended (their job final, their attempt
  superseded, or marked to stop) and have no `ended_at`, or ended and still hold a share
  (the device was never given back);
- `orphan_pods`: of the pods the cluster holds (`pods`; None skips it), those without an
  active allocation;
- `metered_mismatch`: allocations whose metered GPU-time (milli x microseconds of their
  usage records) differs from what they held during the metered hours, or that are metered
  twice for some instant (0 where nothing was metered).

The two instant counts are sweeps in SQL over start (+share) and end (-share) events of
every allocation: per key, the events of one instant are summed, a running sum (a window
function) gives the level after each instant, and each instant where the level goes from
within the cap to above it starts one breach. Intervals are half-open, [started_at,
ended_at): a share given back at the instant another is taken never overlaps it. Quotas and
the tenant tree keep no history, so quota breaches are judged against today's limits and
tree, as metering judges guarantees (docs/billing.md).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import sys
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

PROMISES = (
    "lost",
    "double_allocations",
    "quota_breaches",
    "open_ended_allocations",
    "orphan_pods",
    "metered_mismatch",
)
COUNTS = ("jobs", "not_settled", *PROMISES)
MILLI_PER_DEVICE = 1000
MICROSECOND = timedelta(microseconds=1)


def run_checks(
    *, pods: Collection[str] | None, submitted: Collection[int] | None = None
) -> dict[str, int]:
    """Every count of `COUNTS` over the current database (Django set up). `pods`: the pod
    names the cluster holds now (None: not checked, `orphan_pods` is 0). `submitted`: ids
    of the jobs the caller submitted, each of which must still exist (None: not checked)."""
    from scheduler.models import FINAL_STATES, Job

    jobs, lost = job_counts(submitted)
    return {
        "jobs": jobs,
        "not_settled": Job.objects.exclude(state__in=FINAL_STATES).count(),
        "lost": lost,
        "double_allocations": double_allocations(),
        "quota_breaches": quota_breaches(),
        "open_ended_allocations": open_ended_allocations(),
        "orphan_pods": orphan_pods(pods),
        "metered_mismatch": metered_mismatch(),
    }


def broken(counts: dict[str, int]) -> list[str]:
    """The promises `counts` shows broken, as `name=count`."""
    return [f"{name}={counts[name]}" for name in PROMISES if counts.get(name)]


# --- jobs ----------------------------------------------------------------------------------


def job_counts(submitted: Collection[int] | None) -> tuple[int, int]:
    """(jobs, lost)."""
    from django.db.models import Exists, OuterRef, Q

    from scheduler.models import Allocation, Job, JobState

    active = Allocation.objects.filter(job_id=OuterRef("pk"), ended_at__isnull=True)
    of_attempt = active.filter(attempt=OuterRef("attempt"))
    stuck = Q(
        state__in=(JobState.ADMITTED, JobState.BINDING, JobState.RUNNING),
        has_attempt=False,
    ) | Q(state=JobState.PREEMPTED, holds=False)
    lost = (
        Job.objects.alias(has_attempt=Exists(of_attempt), holds=Exists(active))
        .filter(stuck)
        .count()
    )
    if submitted:
        wanted = set(submitted)
        found = Job.objects.filter(pk__any=list(wanted)).values_list("pk", flat=True)
        lost += len(wanted - set(found))
    return Job.objects.count(), lost


def open_ended_allocations() -> int:
    """Allocations that ended without `ended_at`, and ended ones still holding a share."""
    from django.db.models import F, Q

    from scheduler.models import FINAL_STATES, Allocation, AllocationDevice

    unended = (
        Allocation.objects.filter(ended_at__isnull=True)
        .filter(Q(job__state__in=FINAL_STATES) | ~Q(attempt=F("job__attempt")) | ~Q(end_reason=""))
        .count()
    )
    kept = (
        AllocationDevice.objects.filter(released=False, allocation__ended_at__isnull=False)
        .values("allocation_id")
        .distinct()
        .count()
    )
    return unended + kept


def orphan_pods(pods: Collection[str] | None) -> int:
    from scheduler.models import Allocation

    if not pods:
        return 0
    names = set(pods)
    held = Allocation.objects.filter(ended_at__isnull=True, pod_name__any=list(names))
    return len(names - set(held.values_list("pod_name", flat=True)))


# --- the sweeps ----------------------------------------------------------------------------

# events(k, k2, cap, t, d): +d at an allocation's start, -d at its end, under key (k, k2)
# whose level may not exceed cap. A breach starts at each instant whose level is above the
# cap while the level before it (none: 0) was not.
SWEEP = """
WITH events(k, k2, cap, t, d) AS ({events}),
net AS (SELECT k, k2, cap, t, SUM(d) AS d FROM events GROUP BY k, k2, cap, t),
levels AS (
  SELECT k, k2, t, CASE
    WHEN SUM(d) OVER (PARTITION BY k, k2 ORDER BY t ROWS UNBOUNDED PRECEDING) > cap THEN 1
    ELSE 0 END AS above
  FROM net
),
steps AS (
  SELECT above, LAG(above, 1, 0) OVER (PARTITION BY k, k2 ORDER BY t) AS before FROM levels
)
SELECT COUNT(*) FROM steps WHERE above = 1 AND before = 0
"""


def _events(held: str) -> str:
    """The (k, k2, cap, t, d) events of `held`, a query of (k, k2, cap, started_at, ended_at,
    d) rows: +d at each start, -d at each end."""
    return (
        f"SELECT k, k2, cap, started_at, d FROM ({held}) h"  # noqa: S608 - our queries
        f" UNION ALL SELECT k, k2, cap, ended_at, -d FROM ({held}) h WHERE ended_at IS NOT NULL"
    )


def _sweep(held: str, params: Sequence[Any]) -> int:
    """Breaches over `held`, a query of (k, k2, cap, started_at, ended_at, d) rows."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(SWEEP.format(events=_events(held)), [*params, *params])
        (count,) = cursor.fetchone()
    return int(count)


# Each allocation's share of each device, under the device's cap.
DEVICE_HELD = (
    "SELECT s.device_id AS k, 0 AS k2, %s AS cap, a.started_at, a.ended_at, s.milli AS d"
    " FROM scheduler_allocationdevice s JOIN scheduler_allocation a ON a.id = s.allocation_id"
)

# Each allocation of a job whose class counts against quota, on its flavor, under the
# limit of every quota of that flavor held by its job's tenant or an ancestor.
QUOTA_HELD = (
    "SELECT q.id AS k, 0 AS k2, q.limit_milli AS cap, a.started_at, a.ended_at, a.gpu_milli AS d"
    " FROM tenants_quota q"
    " JOIN tenants_tenant qt ON qt.id = q.tenant_id"
    " JOIN tenants_resourceflavor f ON f.id = q.flavor_id"
    " JOIN scheduler_allocation a ON a.flavor = f.name"
    " JOIN scheduler_job j ON j.id = a.job_id"
    " JOIN tenants_tenant jt ON jt.id = j.tenant_id"
    " JOIN tenants_priorityclass p ON p.id = j.priority_class_id"
    " WHERE p.counts_against_quota = %s AND jt.path LIKE qt.path || '%%'"
)


# Each such allocation again, under its quota's cap for any one user of the job's own tenant
# (the engine's `QuotaLedger.check`: a user cap binds in the tenant that sets it only).
USER_CAP_HELD = (
    "SELECT q.id AS k, j.submitted_by_id AS k2, q.user_limit_milli AS cap, a.started_at,"
    " a.ended_at, a.gpu_milli AS d"
    " FROM tenants_quota q"
    " JOIN tenants_resourceflavor f ON f.id = q.flavor_id"
    " JOIN scheduler_job j ON j.tenant_id = q.tenant_id"
    " JOIN scheduler_allocation a ON a.job_id = j.id AND a.flavor = f.name"
    " JOIN tenants_priorityclass p ON p.id = j.priority_class_id"
    " WHERE p.counts_against_quota = %s AND q.user_limit_milli IS NOT NULL"
)


def double_allocations() -> int:
    """Instants a device's shares summed over 1,000 milli, over every share ever held."""
    return _sweep(DEVICE_HELD, [MILLI_PER_DEVICE])


def quota_breaches() -> int:
    """Instants a tenant's subtree held more of a flavor than its quota's limit, or one user
    more than the quota's cap per user: each allocation of a job whose class counts against
    quota charges its `gpu_milli` on its flavor to its job's tenant and every ancestor
    (`scheduler.core.quota.subtree_usage`), and to its job's submitter in the job's tenant."""
    return _sweep(QUOTA_HELD, [True]) + _sweep(USER_CAP_HELD, [True])


PEAK = """
WITH events(k, k2, cap, t, d) AS ({events}),
net AS (SELECT k, t, SUM(d) AS d FROM events GROUP BY k, t),
levels AS (SELECT k, SUM(d) OVER (PARTITION BY k ORDER BY t ROWS UNBOUNDED PRECEDING) AS level
           FROM net)
SELECT k, MAX(level) FROM levels GROUP BY k
"""


def quota_peaks() -> dict[str, dict[str, float]]:
    """Each quota's highest level over the history, by the same sweep as `quota_breaches`,
    in GPUs beside its guarantee and limit: a run whose peaks stay far below the limits has
    not put the limits to the test, whatever `quota_breaches` says."""
    from django.db import connection

    from tenants.models import Quota

    with connection.cursor() as cursor:
        cursor.execute(PEAK.format(events=_events(QUOTA_HELD)), [True, True])
        peaks = dict(cursor.fetchall())
    out = {}
    for quota in Quota.objects.select_related("tenant", "flavor").order_by("tenant__path"):
        out[f"{quota.tenant.slug}/{quota.flavor.name}"] = {
            "peak_gpus": int(peaks.get(quota.pk) or 0) / MILLI_PER_DEVICE,
            "guaranteed_gpus": quota.guaranteed_milli / MILLI_PER_DEVICE,
            "limit_gpus": quota.limit_milli / MILLI_PER_DEVICE,
        }
    return out


# --- metering ------------------------------------------------------------------------------


def metered_mismatch() -> int:
    """Allocations metered otherwise than they held their devices over the metered hours
    (the union of the metering periods): metered milli x microseconds (the records' own
    `micros`, which statements add up) against the sum of the allocation's shares times its
    time inside those hours; plus allocations with two records covering one instant."""
    from django.db.models import F, Sum, Window
    from django.db.models.functions import Lag

    from billing.models import MeteringPeriod, UsageRecord

    hours = _union(MeteringPeriod.objects.order_by("start").values_list("start", "end"))
    if not hours:
        return 0
    metered = dict(
        UsageRecord.objects.values("allocation_id")
        .annotate(quantity=Sum(F("gpu_milli") * F("micros")))
        .values_list("allocation_id", "quantity")
        .order_by()
    )
    twice = set(
        UsageRecord.objects.annotate(
            before=Window(Lag("end"), partition_by=[F("allocation_id")], order_by=F("start").asc())
        )
        .filter(start__lt=F("before"))
        .values_list("allocation_id", flat=True)
    )
    held = _held(hours)
    wrong = {a for a in metered.keys() | held.keys() if metered.get(a, 0) != held.get(a, 0)}
    return len(wrong | twice)


def _union(periods: Any) -> list[tuple[datetime, datetime]]:
    """Sorted periods merged where they overlap or touch."""
    merged: list[tuple[datetime, datetime]] = []
    for start, end in periods:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _held(hours: list[tuple[datetime, datetime]]) -> dict[int, int]:
    """Allocation id -> milli x microseconds held inside `hours`, for those that held any."""
    from django.db.models import Q, Sum

    from scheduler.models import Allocation

    ends = [end for _, end in hours]
    rows = (
        Allocation.objects.filter(started_at__lt=hours[-1][1])
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=hours[0][0]))
        .annotate(milli=Sum("devices__milli"))
        .filter(milli__gt=0)
        .values_list("id", "started_at", "ended_at", "milli")
        .order_by()
    )
    out: dict[int, int] = {}
    for allocation_id, started, ended, milli in rows.iterator(chunk_size=10_000):
        micros = 0
        for start, end in hours[bisect.bisect_right(ends, started) :]:
            if start >= (ended or end):
                break
            micros += (min(end, ended or end) - max(start, started)) // MICROSECOND
        if micros:
            out[allocation_id] = milli * micros
    return out


# --- the command ---------------------------------------------------------------------------


def _lines(path: Path | None) -> list[str] | None:
    if path is None:
        return None
    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    return [line.strip() for line in text.splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos.checks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--pods", type=Path, help="the cluster's pod names, one a line (-: stdin)")
    parser.add_argument("--submitted", type=Path, help="ids of the jobs submitted, one a line")
    parser.add_argument("--json", type=Path, help="write the counts here too")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    submitted = _lines(args.submitted)
    counts = run_checks(
        pods=_lines(args.pods),
        submitted=None if submitted is None else [int(i) for i in submitted],
    )
    print(json.dumps(counts, indent=2))
    if args.json:
        args.json.write_text(json.dumps(counts, indent=2) + "\n")
    failed = broken(counts)
    if failed:
        print("PROMISES BROKEN: " + ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
