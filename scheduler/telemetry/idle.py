"""Idle GPUs: per-job idle time from the samples, and the tenant's action when it lasts.

A job is idle at a sample time when every device it holds reads under its tenant's threshold
(the nearest `tenants.IdleRule` up the tree, else the settings' defaults). `idle_scan` walks
the samples written since its last run (a watermark, locked: two scans at once do each sample
once), keeps each job's idle episode and idle seconds (`JobIdle`, reset by a busy sample), and
when an episode reaches the rule's duration acts once for it: an email to the job's owner and
the tenant's admins (a Celery task, on commit), and for `notify_and_stop` an interactive job is
stopped through the job lifecycle, with an event that says why.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Sum

from common.errors import ConflictError
from common.words import minutes
from scheduler.jobs.notifications import idle_events_notify
from scheduler.jobs.transitions import job_transition
from scheduler.models import Job, JobIdle, JobState, RollupWatermark, UtilizationSample
from tenants.audit import audit_record
from tenants.idle_rules import Rule, rule_for_tenants
from tenants.models import IdleAction, JobType, Tenant

log = logging.getLogger("gantry.idle")
WATERMARK = "idle"
# The newest samples are left for the next scan: a report being written now may still land
# before this instant (they are stamped when ingested).
SCAN_LAG = timedelta(seconds=5)
# One transaction covers at most this much sample time (2,000 GPUs: 40,000 samples), and a
# first scan starts this far back: a scan after a long pause catches up in bounded steps.
CHUNK = timedelta(minutes=10)
FIRST_SCAN = timedelta(hours=2)
# A gap in a job's samples longer than this many intervals adds no idle time (the node stopped
# reporting: nothing says the job was idle meanwhile). The episode itself goes on.
MAX_GAP_INTERVALS = 2


@dataclass
class ScanResult:
    samples: int = 0
    jobs: int = 0
    acted: list[tuple[int, datetime]] = field(default_factory=list)  # (job, episode start)


def _points(
    rows: Iterable[tuple[int, int, datetime, float]],
) -> dict[int, list[tuple[datetime, float]]]:
    """job -> [(at, busiest device's utilization)] in time order."""
    busiest: dict[int, dict[datetime, float]] = defaultdict(dict)
    for job_id, _, at, util in rows:
        kept = busiest[job_id].get(at)
        busiest[job_id][at] = util if kept is None else max(kept, util)
    return {job: sorted(points.items()) for job, points in busiest.items()}


def _advance(state: JobIdle, points: list[tuple[datetime, float]], rule: Rule) -> None:
    max_gap = MAX_GAP_INTERVALS * settings.GANTRY_UTILIZATION_SAMPLE_S
    for at, util in points:
        if util >= rule.threshold_pct:
            state.idle_since, state.idle_seconds = None, 0.0
        elif state.idle_since is None:
            state.idle_since, state.idle_seconds = at, 0.0
        else:
            gap = (at - state.last_sample_at).total_seconds() if state.last_sample_at else 0.0
            state.idle_seconds_total += min(max(gap, 0.0), max_gap)
            state.idle_seconds = (at - state.idle_since).total_seconds()
        state.last_sample_at = at


def _watermark(now: datetime) -> RollupWatermark:
    """The scan's watermark, locked; a first scan starts FIRST_SCAN back."""
    try:
        with transaction.atomic():
            RollupWatermark.objects.get_or_create(
                name=WATERMARK, defaults={"done_until": now - FIRST_SCAN}
            )
    except IntegrityError:  # another scan made it first
        pass
    return RollupWatermark.objects.select_for_update().get(name=WATERMARK)


def idle_scan(*, now: datetime) -> ScanResult:
    """Advance every job's idle state over the samples since the last scan, CHUNK of sample
    time per transaction, and act on the episodes that reached their rule's duration (once
    each). Returns what it did."""
    result = ScanResult()
    until = now - SCAN_LAG
    while _scan_chunk(now, until, result):
        pass
    rules = rule_for_tenants(
        Job.objects.filter(id__in=[j for j, _ in result.acted]).values_list("tenant_id", flat=True)
    )
    tenants = dict(
        Job.objects.filter(id__in=[j for j, _ in result.acted]).values_list("id", "tenant_id")
    )
    for job_id, _ in result.acted:
        rule = rules[tenants[job_id]]
        if rule.action == IdleAction.NOTIFY_AND_STOP:
            idle_job_stop(job_id=job_id, rule=rule)
    return result


def _scan_chunk(now: datetime, until: datetime, result: ScanResult) -> bool:
    """One transaction: the samples from the watermark to at most CHUNK later (and before
    `until`). True when more remain."""
    with transaction.atomic():
        mark = _watermark(now)
        if until <= mark.done_until:
            return False
        end = min(until, mark.done_until + CHUNK)
        rows = list(
            UtilizationSample.objects.filter(
                at__gte=mark.done_until, at__lt=end, job_id__isnull=False
            ).values_list("job_id", "tenant_id", "at", "utilization_pct")
        )
        acted = _advance_jobs(rows)
        mark.done_until = end
        mark.save(update_fields=["done_until"])
        idle_events_notify(acted)
        for job_id, episode in acted:
            transaction.on_commit(partial(_notify_later, job_id, episode))
    result.samples += len(rows)
    result.jobs += len({r[0] for r in rows})
    result.acted += acted
    return end < until


def _advance_jobs(rows: list[tuple[int, int, datetime, float]]) -> list[tuple[int, datetime]]:
    """Move the idle state of the jobs of `rows` over them; the episodes to act on."""
    points = _points(rows)
    tenants = {job_id: tenant_id for job_id, tenant_id, _, _ in rows}
    rules = rule_for_tenants(set(tenants.values()))
    states = {
        s.job_id: s for s in JobIdle.objects.select_for_update().filter(job_id__in=list(points))
    }
    new = {j: JobIdle(job_id=j, tenant_id=tenants[j]) for j in points if j not in states}
    running = set(
        Job.objects.filter(id__in=list(points), state=JobState.RUNNING).values_list("id", flat=True)
    )
    acted = []
    for job_id, job_points in points.items():
        state = states.get(job_id) or new[job_id]
        rule = rules[tenants[job_id]]
        _advance(state, job_points, rule)
        due = state.idle_since is not None and state.idle_seconds >= rule.duration_s
        if due and state.acted_for != state.idle_since and job_id in running:
            state.acted_for = state.idle_since
            if rule.action != IdleAction.NOTHING:
                acted.append((job_id, state.idle_since))
    JobIdle.objects.bulk_create(new.values())
    JobIdle.objects.bulk_update(
        list(states.values()),
        ["idle_since", "last_sample_at", "idle_seconds", "idle_seconds_total", "acted_for"],
    )
    return acted  # type: ignore[return-value]


def _notify_later(job_id: int, episode: datetime) -> None:
    from scheduler.tasks import idle_notify

    idle_notify.delay(job_id, episode.isoformat())


def idle_job_stop(*, job_id: int, rule: Rule) -> bool:
    """Stop an interactive job that stayed idle (the rule's `notify_and_stop`), through the
    lifecycle's compare-and-swap: cancelled, with an `idle_stopped` event that says why. Other
    job types are only notified (stopping a training run loses work). False when nothing was
    stopped."""
    job = Job.objects.select_related("tenant").filter(pk=job_id).first()
    if job is None or job.job_type != JobType.INTERACTIVE or job.state != JobState.RUNNING:
        return False
    message = (
        f"Stopped: every GPU of this job stayed under {rule.threshold_pct:g} % utilization for "
        f"{minutes(rule.duration_s)} (the idle rule of its team)."
    )
    try:
        with transaction.atomic():
            job = job_transition(
                job=job,
                to_state=JobState.CANCELLED,
                message=message,
                kind="idle_stopped",
                data={"threshold_pct": rule.threshold_pct, "duration_s": rule.duration_s},
            )
            audit_record(
                actor=None,
                action="job.idle_stop",
                tenant=job.tenant,
                target=job,
                before={"state": JobState.RUNNING},
                after={"state": job.state, "reason": message},
            )
    except ConflictError as error:  # it changed meanwhile (finished, cancelled): nothing to do
        log.info("idle stop of job %s skipped: %s", job_id, error)
        return False
    return True


def tenant_idle_seconds(tenant: Tenant) -> dict[str, float]:
    """Idle seconds of the jobs of `tenant`'s subtree: `current` (episodes going on now) and
    `total` (all idle time seen)."""
    jobs = JobIdle.objects.filter(tenant__path__startswith=tenant.path)
    totals = jobs.aggregate(total=Sum("idle_seconds_total"))
    current = jobs.filter(idle_since__isnull=False).aggregate(current=Sum("idle_seconds"))
    return {"current": current["current"] or 0.0, "total": totals["total"] or 0.0}
