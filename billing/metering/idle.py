"""Allocated but idle: GPU time that jobs held while their GPUs read under the idle threshold.

From the hourly per-job utilization roll-ups (scheduler/telemetry/rollups.py: `idle_gpu_seconds`,
the allocated GPU time of the samples under the holding tenant's threshold), priced at the
flavor's list GPU-hour rate of each hour (no priority multiplier, no borrowing discount: it
says what the idle time is worth, not what was charged for it). The lines are showback only:
the same GPU time is already in the used lines, so they are never charged and never change
a charged total. Without samples (a cluster without node agents) there are no lines.

Each line names the cluster the job's allocations held in the hour (their node's, as
metering finds UsageRecord.cluster: `hourly.node_cluster_name`) and is priced at that
cluster's card (its own, else the default), as the used lines are (issue 38). A job runs on
one cluster at a time; an hour in which it held allocations on several (moved off a lost
cluster) has its idle time divided over them in proportion to the GPU time each held. An
hour with no allocation of the job (cannot happen while samples are attributed from
allocations) names no cluster and is priced at the default card.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal
from fractions import Fraction

from django.db.models import Q, Sum

from billing.metering.hourly import node_cluster_name
from billing.models import LineKind
from billing.rates import rating
from billing.rates.rating import HOUR, MICROSECOND
from billing.statements.rollup import DraftLine, price_at, rates_between
from scheduler.models import Allocation, Job, RollupPeriod, RollupScope, UtilizationRollup
from tenants.models import Tenant

Account = tuple[int, int | None, int | None]  # tenant, project, user
# job -> its allocations' (cluster, started_at, ended_at or None, milli-GPU held)
Spans = dict[int, list[tuple[str, datetime, datetime | None, int]]]


def allocated_idle_lines(organisation: Tenant, start: datetime, end: datetime) -> list[DraftLine]:
    """One showback line per account (tenant, project, user), flavor, cluster and rate: the
    allocated-but-idle GPU-hours of the organisation's jobs in the hours of [start, end)."""
    rows = list(
        UtilizationRollup.objects.filter(
            period=RollupPeriod.HOUR,
            scope=RollupScope.JOB,
            start__gte=start,
            start__lt=end,
            idle_gpu_seconds__gt=0,
            tenant__path__startswith=organisation.path,
        ).values_list("key_id", "tenant_id", "project_id", "flavor", "start", "idle_gpu_seconds")
    )
    if not rows:
        return []
    jobs = {r[0] for r in rows}
    owners = dict(Job.objects.filter(id__in=jobs).values_list("id", "submitted_by_id"))
    spans = _spans(jobs, start, end)
    rates = rates_between(start, end)
    held: dict[tuple[Account, str, Decimal, str], Fraction] = defaultdict(Fraction)
    for job_id, tenant_id, project_id, flavor, hour, idle_seconds in rows:
        account = (tenant_id, project_id, owners.get(job_id))
        # In milli-GPU-seconds, the unit of GPU lines (billing/rates/rating.py).
        units = Fraction(round(idle_seconds * 1000))
        for cluster, share in clusters_of(spans.get(job_id, []), hour).items():
            price = price_at(rates, flavor, hour, cluster).gpu_hour
            held[(account, flavor, price, cluster)] += units * share
    return [
        DraftLine(
            rating.make_line((account, flavor, "gpu", LineKind.ALLOCATED_IDLE, price, cluster), q),
            charged=False,
        )
        for (account, flavor, price, cluster), q in sorted(held.items(), key=str)
    ]


def _spans(jobs: set[int], start: datetime, end: datetime) -> Spans:
    """The allocations of `jobs` that overlap [start, end), with their node's cluster."""
    allocations = (
        Allocation.objects.filter(job_id__in=jobs, started_at__lt=end)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=start))
        .annotate(cluster_name=node_cluster_name(), device_milli=Sum("devices__milli"))
        .order_by("id")
        .values_list("job_id", "cluster_name", "started_at", "ended_at", "device_milli")
    )
    spans: Spans = defaultdict(list)
    for job_id, cluster, started_at, ended_at, milli in allocations:
        spans[job_id].append((cluster, started_at, ended_at, milli or 0))
    return spans


def clusters_of(
    spans: list[tuple[str, datetime, datetime | None, int]], hour: datetime
) -> dict[str, Fraction]:
    """The clusters a job held allocations on in [hour, hour + 1 h), each with its share of
    the GPU time held there (milli-GPU x microseconds; time alone where none held a GPU):
    exact fractions that add up to 1. {"": 1} when it held none."""
    until = hour + HOUR
    gpu: dict[str, int] = defaultdict(int)
    time: dict[str, int] = defaultdict(int)
    for cluster, started_at, ended_at, milli in spans:
        micros = (min(until, ended_at or until) - max(hour, started_at)) // MICROSECOND
        if micros > 0:
            gpu[cluster] += milli * micros
            time[cluster] += micros
    weights = gpu if any(gpu.values()) else time
    total = sum(weights.values())
    if not total:
        return {"": Fraction(1)}
    return {cluster: Fraction(w, total) for cluster, w in weights.items() if w}
