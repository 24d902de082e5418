"""Job events for the notification outbox (tenants/outbox.py): started, finished, failed,
preempted, requeued (an attempt lost its node), idle.

What a notification says of other jobs and tenants is what the job's tenant's members may
read in the portal (`reason_text.text_for_members`): its owner's email and its tenant's
webhook leave the portal, and a preemption's message names the preemptor and its team.

`job_events_notify` is called where job events are written (`scheduler.jobs.transitions`, for
every state change), inside their transaction, so a notification exists if and only if the
transition committed. It costs a few queries when some of the events are notable and none
otherwise; it never talks to the network or the broker (the beat sweep delivers).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.urls import reverse
from django.utils import timezone

from common.compiled import fetch_by_ids, fetch_compiled
from common.words import counted
from scheduler.jobs.reasons import text_for_members
from scheduler.models import Job, JobState
from tenants.models import Notification, NotificationKind, NotificationState, Tenant
from tenants.outbox import Event, notifications_add, webhook_owners

# The state a job enters -> the notification it makes.
NOTABLE = {
    JobState.RUNNING: NotificationKind.STARTED,
    JobState.SUCCEEDED: NotificationKind.FINISHED,
    JobState.FAILED: NotificationKind.FAILED,
    JobState.PREEMPTED: NotificationKind.PREEMPTED,
}
VERBS = {
    NotificationKind.STARTED: "started",
    NotificationKind.FINISHED: "finished",
    NotificationKind.FAILED: "failed",
    NotificationKind.PREEMPTED: "was preempted",
    NotificationKind.REQUEUED: "lost its node and was requeued",
}
# An attempt that failed because its node was lost goes back to the queue (`judge`'s
# `_failure_change`): not a state of its own, so told by the event's kind and data.
NODE_LOST = "NodeLost"
# The state word an event's message opens with, which the notification's verb already says
# ("was preempted: Preempted: ...", "finished: Succeeded.", "started: Running: ...").
_SAID = re.compile(r"^(?:Running|Succeeded|Failed|Preempted|Stopped)(?:: |\.$)")


# A job id that no real job has, reversed once: the page's URL for any job is this one with
# the id put in (`reverse` per event was a large part of the daemon's cost per job).
_PLACEHOLDER = 987_654_321


@functools.cache
def _job_url_template() -> tuple[str, str]:
    url = reverse("portal:job-detail", args=[_PLACEHOLDER])
    before, _, after = url.partition(str(_PLACEHOLDER))
    return before, after


def job_link(job_id: int) -> str:
    before, after = _job_url_template()
    return f"{settings.GANTRY_BASE_URL.rstrip('/')}{before}{job_id}{after}"


def _notable_jobs(hooked: bool, ids: list[int]) -> QuerySet[Job, Any]:
    jobs = Job.objects.filter(id__any=ids)
    if not hooked:  # only the owners with an email address receive anything
        jobs = jobs.exclude(submitted_by__email="")
    return jobs.values(
        "id", "name", "tenant_id", "tenant__slug", "tenant__path", "submitted_by__email", "attempt"
    )


def notable_kind(row: Sequence[Any]) -> NotificationKind | None:
    """The notification an event row (job id, kind, from, to, message, data) makes, if any."""
    kind = NOTABLE.get(row[3])
    if kind is None and row[1] == "attempt_failed" and row[3] == JobState.QUEUED:
        return NotificationKind.REQUEUED if _data(row).get("reason") == NODE_LOST else None
    return kind


def _data(row: Sequence[Any]) -> dict[str, Any]:
    return (row[5] if len(row) > 5 else None) or {}


def notice_detail(
    kind: NotificationKind, message: str, data: dict[str, Any], job: dict[str, Any]
) -> str:
    """An event's message as a notification carries it: without the state word its verb
    already says; a requeue's in its own words (which node, which retry); and, for the
    messages that name other jobs or teams (a preemption's), only what the job's tenant's
    members may read."""
    if kind == NotificationKind.REQUEUED:
        retries = data.get("retries_max")
        of = f" of {retries}" if retries is not None else ""
        lost = data.get("detail") or "node lost"
        return f"{lost}; back in the queue for retry {job['attempt']}{of}."
    detail = _SAID.sub("", message)
    if detail and kind == NotificationKind.PREEMPTED:
        tenant = Tenant(pk=job["tenant_id"], slug=job["tenant__slug"], path=job["tenant__path"])
        detail = text_for_members(detail, tenant)
    return detail


def job_events_notify(rows: Iterable[Sequence[Any]]) -> int:
    """Outbox rows for the notable events among `rows` (job id, kind, from, to, message[,
    data]), as `insert_events` takes them. Must run in the events' transaction.

    Only the events someone receives are made: a webhook up the tenant's tree, or the
    owner's email for the kinds that are mailed. Without any webhook configured, only the
    jobs whose owner has an email address are read, and only for the mailed kinds."""
    notable = [(r[0], kind, r[4], _data(r)) for r in rows if (kind := notable_kind(r))]
    if not notable:
        return 0
    emailed = settings.GANTRY_NOTIFY_EMAIL_EVENTS
    hooked = bool(
        fetch_compiled(
            ("webhooks",), lambda: Tenant.objects.exclude(webhook_url="").values("id")[:1]
        )
    )
    if not hooked:
        notable = [n for n in notable if n[1] in emailed]
        if not notable:
            return 0
    jobs = {
        j["id"]: j
        for j in fetch_by_ids(
            ("notable jobs", hooked),
            functools.partial(_notable_jobs, hooked),
            list({n[0] for n in notable}),
        )
    }
    if not jobs:
        return 0
    owners = webhook_owners({j["tenant_id"] for j in jobs.values()}) if hooked else {}
    events = []
    for job_id, kind, said, data in notable:
        job = jobs.get(job_id)
        if job is None:
            continue
        owner = job["submitted_by__email"]
        mailed = bool(owner) and kind in emailed
        if not mailed and job["tenant_id"] not in owners:
            continue
        message = notice_detail(kind, said, data, job)
        text = f"Job {job['name']} (#{job_id}) in '{job['tenant__slug']}' {VERBS[kind]}"
        text += f": {message}" if message else "."
        events.append(
            Event(
                tenant_id=job["tenant_id"],
                kind=kind,
                text=f"{text} {job_link(job_id)}",
                subject=f"[Gantry] job {job['name']} {VERBS[kind]}",
                fields={
                    "job": job_id,
                    "name": job["name"],
                    "tenant": job["tenant__slug"],
                    "attempt": job["attempt"],
                    "message": message,
                    "url": job_link(job_id),
                },
                emails=(owner,) if mailed else (),
            )
        )
    events = _coalesce_preempted(events, jobs)
    made = notifications_add(events, kick=False, owners=owners)
    preempted = [n.pk for n in made if n.kind == NotificationKind.PREEMPTED]
    if preempted:  # held a while, so that more preemptions of the job join it
        Notification.objects.filter(pk__in=preempted).update(
            next_attempt_at=timezone.now() + timedelta(seconds=coalesce_s())
        )
    return len(made)


def coalesce_s() -> float:
    """How long a job's preempted notification waits for more of the job's preemptions to
    join it, as one message with a count (GANTRY_NOTIFY_COALESCE_S)."""
    return float(settings.GANTRY_NOTIFY_COALESCE_S)


def _coalesce_preempted(events: list[Event], jobs: dict[int, dict[str, Any]]) -> list[Event]:
    """`events`, less the preemptions that join a job's preempted notification still held
    (never tried, not yet due): that row's count goes up and its text says so. A row a
    delivery claims meanwhile is left as it is (compare-and-swap on its attempts) and the
    event gets its own row."""
    counts: dict[int, int] = {}
    for event in events:
        if event.kind == NotificationKind.PREEMPTED:
            counts[event.fields["job"]] = counts.get(event.fields["job"], 0) + 1
    if not counts:
        return events
    held = Notification.objects.filter(
        kind=NotificationKind.PREEMPTED,
        state=NotificationState.PENDING,
        attempts=0,
        next_attempt_at__gt=timezone.now(),
        payload__gantry__job__in=list(counts),
    )
    joined: set[int] = set()
    for row in held:
        job_id = row.payload["gantry"]["job"]
        job = jobs[job_id]
        count = int(row.payload["gantry"].get("count", 1)) + counts[job_id]
        times = counted(count, "time")
        text = (
            f"Job {job['name']} (#{job_id}) in '{job['tenant__slug']}' was preempted {times} "
            f"in a row: {row.payload['gantry'].get('message') or 'preempted.'} "
            f"{job_link(job_id)}"
        )
        payload = {"text": text, "gantry": {**row.payload["gantry"], "count": count}}
        subject = f"[Gantry] job {job['name']} was preempted {times}"[:200]
        mine = Notification.objects.filter(pk=row.pk, state=NotificationState.PENDING, attempts=0)
        if mine.update(payload=payload, subject=subject):
            joined.add(job_id)
    if not joined:
        return events
    return [
        e
        for e in events
        if not (e.kind == NotificationKind.PREEMPTED and e.fields["job"] in joined)
    ]


def idle_events_notify(acted: Sequence[tuple[int, datetime]]) -> int:
    """Webhook rows for the idle episodes acted on (the idle email is its own task,
    scheduler/telemetry/idle_mail.py). Must run in the scan's transaction."""
    if not acted:
        return 0
    jobs = {
        j["id"]: j
        for j in Job.objects.filter(id__in=[a[0] for a in acted]).values(
            "id", "name", "tenant_id", "tenant__slug"
        )
    }
    events = [
        Event(
            tenant_id=jobs[job_id]["tenant_id"],
            kind=NotificationKind.IDLE,
            text=(
                f"Job {jobs[job_id]['name']} (#{job_id}) in '{jobs[job_id]['tenant__slug']}' "
                f"holds GPUs that have been idle since {episode:%Y-%m-%d %H:%M} UTC. "
                f"{job_link(job_id)}"
            ),
            fields={
                "job": job_id,
                "name": jobs[job_id]["name"],
                "tenant": jobs[job_id]["tenant__slug"],
                "idle_since": episode.isoformat(),
                "url": job_link(job_id),
            },
        )
        for job_id, episode in acted
        if job_id in jobs
    ]
    return len(notifications_add(events, kick=False))
