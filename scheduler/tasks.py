"""Background work of the scheduler app: utilization roll-ups, retention, idle GPUs.
Tasks are idempotent: two beats, a retry, a rerun are harmless."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from celery import shared_task
from django.utils import timezone

from scheduler.telemetry.idle import idle_scan
from scheduler.telemetry.idle_mail import idle_notification_send
from scheduler.telemetry.queue_history import queue_snapshot_take
from scheduler.telemetry.rollups import retention_run, rollup_run


@shared_task
def utilization_rollup() -> dict[str, Any]:
    """Celery beat, every minute: roll up the closed windows, scan for idle jobs (emails are
    tasks of their own), write the last 5-minute window's queue snapshot for the dashboards,
    then apply retention (docs/utilization.md)."""
    now = timezone.now()
    windows = rollup_run(now=now)
    scan = idle_scan(now=now)
    snapshot = queue_snapshot_take(now=now)
    deleted = retention_run(now=now)
    return {
        "windows": windows,
        "idle_samples": scan.samples,
        "acted": len(scan.acted),
        "queue_snapshot": snapshot,
        **deleted,
    }


@shared_task(autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def idle_notify(job_id: int, episode: str) -> bool:
    return idle_notification_send(job_id, datetime.fromisoformat(episode))
