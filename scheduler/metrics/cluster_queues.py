"""Kueue's ClusterQueue series, for Gantry's tenants: read from the database at scrape.

A Kueue ClusterQueue is a Gantry tenant (`cluster_queue` = its slug) and a cohort its parent
(`cohort` = the parent's slug, "" for a root). The names are Kueue's with `gantry_` for
`kueue_` (docs/metrics.md says why). Every gauge family here is one query (quota: three),
whatever the number of tenants or jobs; counters and the histogram are derived from
`JobEvent`, which every process writes in the transaction of the change, so the web server
reports what the daemon did without sharing memory with it. They are kept as running totals
(scheduler/metrics/tally.py) and read once per scrape for both families.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from django.db.models import Count, FilteredRelation, Q
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from scheduler.core.units import MILLI_PER_GPU
from scheduler.metrics.tally import WAIT_BUCKETS_S, Tallies
from scheduler.models import JobState
from scheduler.snapshot.quota_usage import charged_ledger
from tenants.models import Tenant

S = JobState
GPU = "nvidia.com/gpu"
HOLDING = (S.ADMITTED, S.BINDING, S.RUNNING)


def pending_families() -> Iterator[GaugeMetricFamily]:
    """Queued jobs per tenant: `inadmissible` when the engine has said why it waits (a reason)
    or it sits out a retry backoff, `active` otherwise (not yet tried since it was queued).
    Every tenant gets both statuses, 0 included, as Kueue reports every ClusterQueue."""
    now = timezone.now()
    # Joined on the live states only (index job_tenant_state), not on every job ever run.
    live = FilteredRelation("jobs", condition=Q(jobs__state__in=(S.QUEUED, *HOLDING)))
    queued = Q(live__state=S.QUEUED)
    held_back = ~Q(live__reason="") | Q(live__not_before__gt=now)
    rows = (
        Tenant.objects.annotate(live=live)
        .values_list("slug")
        .annotate(
            inadmissible=Count("live", filter=queued & held_back),
            queued=Count("live", filter=queued),
            holding=Count("live", filter=Q(live__state__in=HOLDING)),
        )
    )
    pending = GaugeMetricFamily(
        "gantry_pending_workloads",
        "Queued jobs per tenant (cluster_queue) and status (active, inadmissible).",
        labels=["cluster_queue", "status"],
    )
    admitted = GaugeMetricFamily(
        "gantry_admitted_active_workloads",
        "Jobs holding their admission (admitted, binding, running) per tenant.",
        labels=["cluster_queue"],
    )
    for slug, inadmissible, queued_n, holding in rows.order_by("slug"):
        pending.add_metric([slug, "active"], queued_n - inadmissible)
        pending.add_metric([slug, "inadmissible"], inadmissible)
        admitted.add_metric([slug], holding)
    yield pending
    yield admitted


def wait_families(tallies: Tallies) -> Iterator[Any]:
    """Admissions (queued -> admitted events) per tenant and priority class, and the wait
    before each: from the job's latest entry into the queue (submission, approval or requeue)
    to its admission, as Kueue's "created or requeued until admission"."""
    histogram = HistogramMetricFamily(
        "gantry_admission_wait_time_seconds",
        "Time from a job's entry into the queue (submitted, approved or requeued) to its "
        "admission, per tenant and priority class.",
        labels=["cluster_queue", "priority_class"],
    )
    admitted = CounterMetricFamily(
        "gantry_admitted_workloads",
        "Admissions per tenant (a requeued job counts again).",
        labels=["cluster_queue"],
    )
    per_tenant: dict[str, int] = defaultdict(int)
    for (slug, klass), per_bucket in sorted(tallies.waits.items()):
        running, buckets = 0, []
        for bound, n in zip((*WAIT_BUCKETS_S, float("inf")), per_bucket, strict=True):
            running += n
            buckets.append((_bound(bound), running))
        histogram.add_metric([slug, klass], buckets, tallies.wait_sums[(slug, klass)])
        per_tenant[slug] += running
    for slug, n in sorted(per_tenant.items()):
        admitted.add_metric([slug], n)
    yield histogram
    yield admitted


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else f"{value:g}"


# Preemptions: the engine preempts within a tenant by priority, across tenants only to reclaim
# a guarantee from a tenant that borrows, and best-effort jobs (which count against no quota)
# for anyone. The event says which: the victim's tenant and class, and the preemptor's tenant.
IN_TENANT, RECLAIM, BEST_EFFORT = "InClusterQueue", "InCohortReclamation", "InCohortBestEffort"


def preemption_families(tallies: Tallies) -> Iterator[CounterMetricFamily]:
    """`preempted` events: by the engine (the event names its preemptor) or by a drain."""
    preempted = CounterMetricFamily(
        "gantry_preempted_workloads",
        "Jobs preempted by the engine, per tenant of the preempting job and reason "
        "(InClusterQueue, InCohortReclamation, InCohortBestEffort).",
        labels=["preempting_cluster_queue", "reason"],
    )
    evicted = CounterMetricFamily(
        "gantry_evicted_workloads",
        "Jobs stopped and returned to the queue, per tenant and reason (Preempted, NodeDrained).",
        labels=["cluster_queue", "reason"],
    )
    by_preemptor: dict[tuple[str, str], int] = defaultdict(int)
    by_victim: dict[tuple[str, str], int] = defaultdict(int)
    for (victim, charged, preemptor), n in tallies.preemptions.items():
        if preemptor is None:
            by_victim[(victim, "NodeDrained")] += n
            continue
        by_victim[(victim, "Preempted")] += n
        reason = BEST_EFFORT if not charged else IN_TENANT if preemptor == victim else RECLAIM
        by_preemptor[(preemptor, reason)] += n
    for (tenant, reason), n in sorted(by_preemptor.items()):
        if n:
            preempted.add_metric([tenant, reason], n)
    for (tenant, reason), n in sorted(by_victim.items()):
        if n:
            evicted.add_metric([tenant, reason], n)
    yield preempted
    yield evicted


def quota_families() -> Iterator[GaugeMetricFamily]:
    """Per tenant and flavor, in GPUs: usage of its subtree (admitted and running jobs of
    classes that count against quota, as the engine charges them), its effective guarantee
    (nominal quota), borrowing limit (limit - guarantee) and what it borrows (usage beyond
    the guarantee). Three queries: tenants, quotas, active allocations."""
    ledger, flavors = charged_ledger()
    parents = {t.name: t.parent or "" for t in ledger.tenants.values()}
    names = {
        "usage": ("gantry_cluster_queue_resource_usage", "GPUs in use by the tenant's subtree."),
        "nominal": ("gantry_cluster_queue_nominal_quota", "The tenant's effective guarantee."),
        "borrowing_limit": (
            "gantry_cluster_queue_borrowing_limit",
            "GPUs the tenant may use beyond its guarantee (limit - guarantee).",
        ),
        "borrowed": (
            "gantry_cluster_queue_borrowed_resources",
            "GPUs the tenant's subtree uses beyond its guarantee (borrowed from idle guarantees).",
        ),
    }
    labels = ["cohort", "cluster_queue", "flavor", "resource"]
    families = {k: GaugeMetricFamily(n, text, labels=labels) for k, (n, text) in names.items()}
    for slug in sorted(ledger.tenants):
        quotas = ledger.tenants[slug].quotas
        for flavor in sorted(flavors):
            used = ledger.usage[(slug, flavor)]
            if flavor not in quotas and not used:
                continue
            key = [parents[slug], slug, flavor, GPU]
            families["usage"].add_metric(key, used / MILLI_PER_GPU)
            families["nominal"].add_metric(key, ledger.guarantee(slug, flavor) / MILLI_PER_GPU)
            families["borrowed"].add_metric(key, ledger.borrowing(slug, flavor) / MILLI_PER_GPU)
            quota = quotas.get(flavor)
            if quota is not None and quota.limit is not None:
                spare = max(0, quota.limit - ledger.guarantee(slug, flavor))
                families["borrowing_limit"].add_metric(key, spare / MILLI_PER_GPU)
    yield from families.values()
