"""The dashboards' data: the cluster's and a tenant's over a time range (a job's is in
scheduler/telemetry/job_dashboard.py).

Selectors called by the portal's views and by bench/dashboards.py, so that the benchmark
times what a page view reads. They read pre-aggregated rows only: the utilization roll-ups
(5-minute windows for ranges up to a day, hourly beyond), the queue's 5-minute snapshots
(scheduler/telemetry/queue_history.py), job events for failures, and the idle time kept per job. A
fixed number of queries each, whatever the range or the size of the cluster. Who may see what
is the caller's check (`tenants.access`): these return what they are asked for.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, F, IntegerField, Max, Q, QuerySet, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, TruncHour

from scheduler.metrics.cluster_queues import WAIT_BUCKETS_S
from scheduler.models import (
    Job,
    JobEvent,
    JobIdle,
    QueueSnapshot,
    RollupPeriod,
    RollupScope,
    UtilizationRollup,
)
from scheduler.telemetry.rollups import floor_to
from tenants.models import Quota, Tenant

# range key -> (length, roll-up period read). A day at 5 minutes is 288 points a series; a
# month hourly 720.
RANGES: dict[str, tuple[timedelta, str]] = {
    "6h": (timedelta(hours=6), RollupPeriod.FIVE_MINUTES),
    "24h": (timedelta(hours=24), RollupPeriod.FIVE_MINUTES),
    "7d": (timedelta(days=7), RollupPeriod.HOUR),
    "30d": (timedelta(days=30), RollupPeriod.HOUR),
}
DEFAULT_RANGE = "24h"
STEPS: dict[str, timedelta] = {
    RollupPeriod.FIVE_MINUTES: timedelta(minutes=5),
    RollupPeriod.HOUR: timedelta(hours=1),
}
TOP_IDLE = 10
FAILURE_KINDS = ("attempt_failed", "bind_failed", "preempted")


@dataclass(frozen=True)
class Window:
    """[since, until) read at `period` grain; `key` is the range's name."""

    key: str
    since: datetime
    until: datetime
    period: str

    @property
    def step(self) -> timedelta:
        return STEPS[self.period]


def window_for(key: str, now: datetime) -> Window:
    """The range named `key` ending at `now`'s window. ValueError for an unknown name."""
    if key not in RANGES:
        raise ValueError(f"{key[:20]!r} is not a range; choose one of {', '.join(RANGES)}.")
    length, period = RANGES[key]
    until = floor_to(now, STEPS[period]) + STEPS[period]
    return Window(key=key, since=until - length, until=until, period=period)


@dataclass(frozen=True)
class CapacityPoint:
    start: datetime
    allocated: float  # GPUs held by jobs, mean over the window
    used: float  # GPU-equivalents busy (utilization x devices), mean over the window


@dataclass(frozen=True)
class QueuePoint:
    start: datetime
    queued_jobs: int  # the most waiting at one 5-minute reading in the point
    queued_gpus: float  # GPUs those jobs ask, at the same reading
    admissions: int
    wait_mean_s: float | None
    wait_p95_s: float | None  # the bound of the bucket holding the 95th percentile


@dataclass(frozen=True)
class FragmentationPoint:
    start: datetime
    free: float
    fragmented: float


@dataclass(frozen=True)
class IdleRow:
    job_id: int
    name: str
    tenant: str
    gpu_hours: float
    idle_gpu_hours: float

    @property
    def idle_share(self) -> float:
        return self.idle_gpu_hours / self.gpu_hours if self.gpu_hours else 0.0


@dataclass
class ClusterDashboard:
    window: Window
    capacity: dict[str, list[CapacityPoint]] = field(default_factory=dict)  # per flavor
    queue: list[QueuePoint] = field(default_factory=list)
    fragmentation: dict[str, list[FragmentationPoint]] = field(default_factory=dict)
    failures: list[tuple[str, int]] = field(default_factory=list)  # (reason, count)
    idle: list[IdleRow] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.capacity or self.queue or self.failures or self.idle)


def _per_gpu(seconds: float, step: timedelta) -> float:
    return seconds / step.total_seconds()


def capacity_by_flavor(
    rows: Iterable[tuple[str, datetime, float, float, int]], step: timedelta
) -> dict[str, list[CapacityPoint]]:
    """Roll-up rows (flavor, start, gpu-seconds, utilization mean %, samples) -> points per
    flavor. A window's devices are its samples x the sampling interval / the window; busy
    GPU-equivalents are those devices x their mean utilization."""
    interval = settings.GANTRY_UTILIZATION_SAMPLE_S
    out: dict[str, list[CapacityPoint]] = defaultdict(list)
    for flavor, start, gpu_seconds, mean, samples in rows:
        devices = _per_gpu(samples * interval, step)
        out[flavor].append(CapacityPoint(start, _per_gpu(gpu_seconds, step), devices * mean / 100))
    return dict(out)


def _p95(buckets: Sequence[int]) -> float | None:
    total = sum(buckets)
    if not total:
        return None
    running = 0
    for bound, n in zip((*WAIT_BUCKETS_S, float("inf")), buckets, strict=False):
        running += n
        if running >= 0.95 * total:
            return bound
    return float("inf")


def queue_points(
    readings: Iterable[tuple[datetime, int, float]],
    admitted: Iterable[tuple[datetime, int, float, Sequence[int]]],
    step: timedelta,
) -> list[QueuePoint]:
    """`readings`: (at, queued jobs, queued GPUs) per 5-minute reading (a subtree's tenants
    added up); `admitted`: (step start, admissions, summed wait, count per wait bucket) ->
    a point per `step` with the largest queue read in it, its admissions and their waits."""
    peaks: dict[datetime, tuple[float, float]] = {}  # (jobs, GPUs) at the largest reading
    for at, queued, asked in readings:
        start = floor_to(at, step)
        peaks[start] = max(peaks.get(start, (0.0, 0.0)), (queued, float(asked)))
    waits = {start: (n, waited, buckets) for start, n, waited, buckets in admitted}
    points = []
    for start in sorted(set(peaks) | set(waits)):
        most, asked = peaks.get(start, (0.0, 0.0))
        n, waited, buckets = waits.get(start, (0, 0.0, ()))
        points.append(
            QueuePoint(
                start=start,
                queued_jobs=int(most),
                queued_gpus=asked,
                admissions=n,
                wait_mean_s=waited / n if n else None,
                wait_p95_s=_p95(buckets),
            )
        )
    return points


def _queue(snapshots: QuerySet[QueueSnapshot], window: Window) -> list[QueuePoint]:
    """The queue over `window` from its snapshot rows (of the cluster, or of a subtree's
    tenants): two queries, aggregated in the database per step (the wait buckets summed by
    their index in the JSON array), so that a month is 720 rows a tenant, not 8,640. Each
    tenant's largest reading in the step, added up over the subtree: exact for the cluster
    and a team (one row a reading), at most the sum of its teams' peaks for a department."""
    rows = snapshots.filter(at__gte=window.since, at__lt=window.until)
    step = TruncHour("at") if window.period == RollupPeriod.HOUR else F("at")
    peaks = (
        rows.annotate(step=step)
        .values_list("step", "tenant_id")
        .annotate(jobs=Max("queued_jobs"), gpus=Max("queued_gpus"))
        .order_by()
    )
    readings: dict[datetime, list[float]] = defaultdict(lambda: [0, 0.0])
    for start, _tenant, jobs, gpus in peaks:
        readings[start][0] += jobs
        readings[start][1] += gpus
    buckets = {
        f"b{i}": Sum(Cast(KT(f"wait_buckets__{i}"), IntegerField()))
        for i in range(len(WAIT_BUCKETS_S) + 1)
    }
    admitted = (
        rows.filter(admissions__gt=0)
        .annotate(step=step)
        .values_list("step")
        .annotate(n=Sum("admissions"), waited=Sum("wait_sum_s"), **buckets)
        .order_by()
    )
    return queue_points(
        ((start, int(jobs), gpus) for start, (jobs, gpus) in readings.items()),
        ((a[0], a[1], a[2], [n or 0 for n in a[3:]]) for a in admitted),
        window.step,
    )


def _fragmentation(rows: Iterable[tuple[datetime, dict]], step: timedelta) -> dict:  # type: ignore[type-arg]
    """Cluster snapshot rows (at, {flavor: [free, fragmented]}) -> points per flavor: the
    last reading of each `step` (a state, not a sum)."""
    last: dict[str, dict[datetime, FragmentationPoint]] = defaultdict(dict)
    for at, flavors in rows:
        for flavor, (free, fragmented) in (flavors or {}).items():
            last[flavor][floor_to(at, step)] = FragmentationPoint(
                floor_to(at, step), free, fragmented
            )
    return {flavor: [p[k] for k in sorted(p)] for flavor, p in sorted(last.items())}


def _in_window(window: Window) -> Q:
    return Q(period=window.period, start__gte=window.since, start__lt=window.until)


def _idle_rows(window: Window) -> list[IdleRow]:
    """The jobs with the most idle GPU time in the window, from the hourly job roll-ups that
    have idle time (their partial index `rollup_job_idle`), then what those jobs held in the
    window and their names: three queries, whatever the number of jobs."""
    hours = Q(
        period=RollupPeriod.HOUR,
        scope=RollupScope.JOB,
        start__gte=floor_to(window.since, STEPS[RollupPeriod.HOUR]),
        start__lt=window.until,
    )
    top = list(
        UtilizationRollup.objects.filter(hours, idle_gpu_seconds__gt=0)
        .values_list("key_id")
        .annotate(idle=Sum("idle_gpu_seconds"))
        .order_by("-idle", "key_id")[:TOP_IDLE]
    )
    ids = [key for key, _ in top]
    held = dict(
        UtilizationRollup.objects.filter(hours, key_id__in=ids)
        .values_list("key_id")
        .annotate(held=Sum("gpu_seconds"))
        .order_by()
    )
    names = {
        pk: (name, slug)
        for pk, name, slug in Job.objects.filter(pk__in=ids).values_list(
            "pk", "name", "tenant__slug"
        )
    }
    return [
        IdleRow(key, *names.get(key, (f"job {key}", "")), held.get(key, 0.0) / 3600, idle / 3600)
        for key, idle in top
    ]


def cluster_dashboard(window: Window) -> ClusterDashboard:
    """The cluster's figures over `window`: eight queries (flavor roll-ups, the queue's
    readings, admissions and fragmentation, failure events, the most idle jobs, what they
    held and their names)."""
    capacity = UtilizationRollup.objects.filter(
        _in_window(window), scope=RollupScope.FLAVOR, key_id=0
    ).values_list("flavor", "start", "gpu_seconds", "utilization_mean", "samples")
    cluster = QueueSnapshot.objects.filter(tenant__isnull=True)
    # Free and fragmented GPUs are states: the last reading of each step.
    last = cluster.filter(at__gte=window.since, at__lt=window.until)
    if window.period == RollupPeriod.HOUR:
        last = last.filter(at__minute=55)
    fragmentation = last.values_list("at", "flavors").order_by("at")
    failures = (
        JobEvent.objects.filter(at__gte=window.since, at__lt=window.until, kind__in=FAILURE_KINDS)
        .annotate(why=KT("data__reason"))
        .values_list("kind", "why")
        .annotate(n=Count("id"))
        .order_by()
    )
    counted: dict[str, int] = defaultdict(int)
    for kind, why, n in failures:
        counted[why or kind.replace("_", " ")] += n
    return ClusterDashboard(
        window=window,
        capacity=capacity_by_flavor(capacity.order_by("flavor", "start"), window.step),
        queue=_queue(cluster, window),
        fragmentation=_fragmentation(fragmentation, window.step),
        failures=sorted(counted.items(), key=lambda item: (-item[1], item[0])),
        idle=_idle_rows(window),
    )


@dataclass(frozen=True)
class UsagePoint:
    start: datetime
    used: float  # GPUs the subtree's jobs held, mean over the window
    borrowed: float  # beyond the guarantee
    lent: float  # guarantee left unused: lendable to the cohort
    guaranteed: float | None  # today's quota; None without one for the flavor
    limit: float | None


@dataclass(frozen=True)
class FlavorQuota:
    guaranteed: float
    limit: float


@dataclass
class TenantDashboard:
    tenant: Tenant
    window: Window
    quotas: dict[str, FlavorQuota] = field(default_factory=dict)
    usage: dict[str, list[UsagePoint]] = field(default_factory=dict)  # per flavor
    idle: list[tuple[datetime, float, float]] = field(default_factory=list)  # (start, held, idle)
    queue: list[QueuePoint] = field(default_factory=list)
    idle_jobs: list[IdleRow] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.usage or self.queue or self.idle_jobs)


def tenant_dashboard(tenant: Tenant, window: Window) -> TenantDashboard:
    """`tenant`'s subtree over `window`: its usage per flavor against the tenant's quota
    today (guarantee and limit; borrowed is use beyond the guarantee, lent the guarantee left
    unused), its idle GPU time, its jobs' waits, and its jobs with the most idle time. Six
    queries (subtree, quotas, roll-ups, the queue's readings and admissions, idle jobs with
    their names)."""
    subtree = Tenant.objects.filter(path__startswith=tenant.path).order_by()
    ids = list(subtree.values_list("pk", flat=True))
    quotas = {
        name: FlavorQuota(guaranteed / 1000, limit / 1000)
        for name, guaranteed, limit in Quota.objects.filter(
            tenant=tenant, cluster__isnull=True
        ).values_list("flavor__name", "guaranteed_milli", "limit_milli")
    }
    rows = (
        UtilizationRollup.objects.filter(
            _in_window(window), scope=RollupScope.TENANT, key_id__in=ids
        )
        .values_list("flavor", "start")
        .annotate(held=Sum("gpu_seconds"), idle=Sum("idle_gpu_seconds"))
        .order_by("flavor", "start")
    )
    usage: dict[str, list[UsagePoint]] = defaultdict(list)
    idle: dict[datetime, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for flavor, start, held, idle_s in rows:
        used = _per_gpu(held, window.step)
        quota = quotas.get(flavor)
        guaranteed = quota.guaranteed if quota else 0.0
        usage[flavor].append(
            UsagePoint(
                start,
                used,
                borrowed=max(0.0, used - guaranteed),
                lent=max(0.0, guaranteed - used),
                guaranteed=quota.guaranteed if quota else None,
                limit=quota.limit if quota else None,
            )
        )
        idle[start][0] += used
        idle[start][1] += _per_gpu(idle_s, window.step)
    return TenantDashboard(
        tenant=tenant,
        window=window,
        quotas=quotas,
        usage=dict(usage),
        idle=[(start, *idle[start]) for start in sorted(idle)],  # type: ignore[misc]
        queue=_queue(QueueSnapshot.objects.filter(tenant_id__in=ids), window),
        idle_jobs=_tenant_idle_jobs(ids),
    )


def _tenant_idle_jobs(tenant_ids: Sequence[int]) -> list[IdleRow]:
    """The subtree's jobs with the most idle time seen (the idle scan's totals, all time):
    one query on JobIdle's tenant index."""
    rows = (
        JobIdle.objects.filter(tenant_id__in=tenant_ids, idle_seconds_total__gt=0)
        .order_by("-idle_seconds_total", "job_id")
        .values_list("job_id", "job__name", "tenant__slug", "idle_seconds_total", "job__replicas")[
            :TOP_IDLE
        ]
    )
    return [IdleRow(pk, name, slug, 0.0, idle / 3600) for pk, name, slug, idle, _ in rows]
