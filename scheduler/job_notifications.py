"""Job events for the notification outbox (tenants/outbox.py): started, finished, failed,
preempted, idle.

`job_events_notify` is called where job events are written (the daemon's bulk inserts and
`job_transition`), inside their transaction, so a notification exists if and only if the
transition committed. It costs a few queries when some of the events are notable and none
otherwise; it never talks to the network or the broker (the beat sweep delivers).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.urls import reverse

from scheduler.models import Job, JobState
from tenants.models import NotificationKind
from tenants.outbox import Event, notifications_add

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
}


def job_link(job_id: int) -> str:
    return settings.GANTRY_BASE_URL.rstrip("/") + reverse("portal:job-detail", args=[job_id])


def job_events_notify(rows: Iterable[Sequence[Any]]) -> int:
    """Outbox rows for the notable events among `rows` (job id, kind, from, to, message[,
    data]), as `insert_events` takes them. Must run in the events' transaction."""
    notable = [(r[0], NOTABLE[r[3]], r[4]) for r in rows if r[3] in NOTABLE]
    if not notable:
        return 0
    jobs = {
        j["id"]: j
        for j in Job.objects.filter(id__in={n[0] for n in notable}).values(
            "id", "name", "tenant_id", "tenant__slug", "submitted_by__email", "attempt"
        )
    }
    emailed = settings.GANTRY_NOTIFY_EMAIL_EVENTS
    events = []
    for job_id, kind, message in notable:
        job = jobs.get(job_id)
        if job is None:
            continue
        text = f"Job {job['name']} (#{job_id}) in '{job['tenant__slug']}' {VERBS[kind]}"
        text += f": {message}" if message else "."
        owner = job["submitted_by__email"]
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
                emails=(owner,) if owner and kind in emailed else (),
            )
        )
    return len(notifications_add(events, kick=False))


def idle_events_notify(acted: Sequence[tuple[int, datetime]]) -> int:
    """Webhook rows for the idle episodes acted on (the idle email is its own task,
    scheduler/idle_notifications.py). Must run in the scan's transaction."""
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
