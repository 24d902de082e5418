"""Reads on jobs, scoped to what the user may see."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Max, Q, QuerySet
from django.http import Http404

from scheduler.leader import LEASE_NAME
from scheduler.models import Job, JobEvent, JobQueueEstimate, JobState, SchedulerLease
from tenants import access


def job_list_visible(user: Any) -> QuerySet[Job]:
    jobs = Job.objects.select_related("project", "tenant", "priority_class", "submitted_by")
    return access.visible_by_tenant(user, jobs)


def access_job(user: Any, job_id: Any) -> Job:
    """The job if the user may see it, else 404 (never 403: ids reveal nothing)."""
    try:
        return job_list_visible(user).get(pk=int(job_id))
    except (ValueError, TypeError, Job.DoesNotExist):
        raise Http404("Not found.") from None


def may_read_job_logs(user: Any, job: Job) -> bool:
    """Logs are the job's own output and may hold secrets it printed; they are not cost data.
    Its tenant's members (a role on the tenant or above it) and platform admins read them;
    finance, who sees every job and what it cost, does not without such a role."""
    grants = access.grants_for(user)
    return grants.platform_admin or grants.role_on(job.tenant) is not None


def access_job_logs(user: Any, job_id: Any) -> Job:
    """The job whose logs the user may read (`may_read_job_logs`), else 404 like a job the
    user cannot see."""
    job = access_job(user, job_id)
    if not may_read_job_logs(user, job):
        raise Http404("Not found.")
    return job


def job_event_list(job: Job) -> QuerySet[JobEvent]:
    return job.events.select_related("actor").order_by("at", "id")


def job_ids_visible(user: Any, ids: Iterable[int]) -> set[int]:
    """Which of ``ids`` name jobs the user may see (for texts that mention other jobs)."""
    return set(
        access.visible_by_tenant(user, Job.objects.filter(pk__in=list(ids))).values_list(
            "pk", flat=True
        )
    )


# A daemon that failed this many cycles with no failure-free minute between them (the
# daemon's `CycleReports` clears the count only then) is "failing".
FAILING_AFTER = 3


@dataclass(frozen=True)
class SchedulerHealth:
    """How the scheduler daemon is doing, from its lease row.

    `status`: "ok" (a cycle completed lately), "failing" (FAILING_AFTER cycles or more failed,
    with completed ones between them or not, and no failure-free minute since: `error` says
    why), "stale" (no cycle completed within `stale_after`: the daemon
    is stopped, hung or cannot reach the database) or "not running" (never led)."""

    status: str
    holder: str = ""
    epoch: int = 0
    last_cycle_at: datetime | None = None
    failures: int = 0
    failed_at: datetime | None = None
    error: str = ""


def scheduler_health(now: datetime) -> SchedulerHealth:
    lease = SchedulerLease.objects.filter(name=LEASE_NAME).first()
    if lease is None or (lease.cycle_ok_at is None and lease.cycle_failed_at is None):
        return SchedulerHealth("not running")
    stale_after = timedelta(seconds=settings.GANTRY_SCHEDULER_STALE_AFTER_S)
    if lease.cycle_failures >= FAILING_AFTER:
        status = "failing"
    elif lease.cycle_ok_at is None or now - lease.cycle_ok_at > stale_after:
        status = "stale"
    else:
        status = "ok"
    return SchedulerHealth(
        status,
        holder=lease.holder,
        epoch=lease.epoch,
        last_cycle_at=lease.cycle_ok_at,
        failures=lease.cycle_failures,
        failed_at=lease.cycle_failed_at,
        error=lease.cycle_error if lease.cycle_failures else "",
    )


@dataclass(frozen=True)
class QueueDepth:
    """Jobs waiting cluster-wide. `queued` splits as the metrics' pending series do
    (scheduler/metrics/cluster_queues.py): `inadmissible` when the engine said why it waits or it
    sits out a retry backoff, `active` otherwise."""

    pending_approval: int
    active: int
    inadmissible: int

    @property
    def queued(self) -> int:
        return self.active + self.inadmissible


def queue_depth(now: datetime) -> QueueDepth:
    """One query, whatever the number of jobs (index job_tenant_state serves the filter)."""
    waiting = Job.objects.filter(state__in=(JobState.PENDING_APPROVAL, JobState.QUEUED))
    held_back = ~Q(reason="") | Q(not_before__gt=now)
    counts = waiting.aggregate(
        pending_approval=Count("pk", filter=Q(state=JobState.PENDING_APPROVAL)),
        queued=Count("pk", filter=Q(state=JobState.QUEUED)),
        inadmissible=Count("pk", filter=Q(state=JobState.QUEUED) & held_back),
    )
    return QueueDepth(
        pending_approval=counts["pending_approval"],
        active=counts["queued"] - counts["inadmissible"],
        inadmissible=counts["inadmissible"],
    )


# The jobs ahead listed by id (the nearest ones); the rest of those the viewer may see are
# counted with them, and the ones they may not see only counted.
AHEAD_SHOWN = 20


@dataclass(frozen=True)
class QueuePosition:
    """Where a queued job stands for one viewer (`job_queue_position`). `ahead` lists the
    nearest jobs ahead the viewer may see (best first, at most AHEAD_SHOWN);
    `ahead_visible` counts all of those, `ahead_hidden` the others: jobs of teams the
    viewer may not see, never named. Times from the daemon's last refresh
    (scheduler/estimates/refresh.py): `eta_*` None with `estimated_at` set means not expected
    within the replay's horizon, with `estimated_at` None not estimated yet."""

    position_tenant: int
    position_cluster: int
    ahead_count: int
    ahead: list[Job]
    ahead_visible: int
    ahead_hidden: int
    eta_p50: datetime | None
    eta_p90: datetime | None
    estimated_at: datetime | None
    computed_at: datetime

    @property
    def ahead_unlisted(self) -> int:
        """Jobs ahead the viewer may see beyond those listed in `ahead`."""
        return self.ahead_visible - len(self.ahead)


def queue_refreshed_at() -> datetime | None:
    """When the daemon last worked the queue's positions out (None: never, or no job was
    queued then): a queued job without a position that was queued before it lies outside
    the daemon's window; one queued after it waits for the next refresh."""
    return JobQueueEstimate.objects.aggregate(at=Max("computed_at"))["at"]


def job_queue_note(job: Job) -> str | None:
    """Why a queued job has no stored position yet (None when it is not queued): queued or
    requeued since the daemon last worked the positions out, or outside the window of jobs
    it considers at once. Shown where the position would be (API, portal, CLI)."""
    if job.state != JobState.QUEUED:
        return None
    refreshed = queue_refreshed_at()
    if refreshed is None or job.queued_at is None or job.queued_at >= refreshed:
        every = round(settings.GANTRY_ETA_EVERY_S)
        return (
            "Queued; the scheduler places it in its order at its next pass "
            f"(every {every} s), with an expected start."
        )
    return (
        "Queued behind the jobs the scheduler considers at once: it has no position until "
        "jobs ahead of it start."
    )


def job_queue_position(user: Any, job: Job) -> QueuePosition | None:
    """The position of `job` (which `user` may see) as the daemon last stored it; None when
    the job does not wait in the queue or has not been placed in it yet."""
    if job.state != JobState.QUEUED:
        return None
    stored = JobQueueEstimate.objects.filter(job_id=job.pk).first()
    if stored is None:
        return None
    ahead = access.visible_by_tenant(
        user,
        Job.objects.filter(queue_estimate__position_cluster__lt=stored.position_cluster),
    )
    visible = ahead.count()
    nearest = list(
        ahead.select_related("tenant", "queue_estimate").order_by(
            "-queue_estimate__position_cluster"
        )[:AHEAD_SHOWN]
    )
    return QueuePosition(
        position_tenant=stored.position_tenant,
        position_cluster=stored.position_cluster,
        ahead_count=stored.ahead_count,
        ahead=nearest[::-1],
        ahead_visible=visible,
        ahead_hidden=max(0, stored.ahead_count - visible),
        eta_p50=stored.eta_p50,
        eta_p90=stored.eta_p90,
        estimated_at=stored.estimated_at,
        computed_at=stored.computed_at,
    )
