"""Background work of the what-if replays. Idempotent: a second delivery finds the run claimed."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from whatif import runs


@shared_task
def whatif_run(whatif_id: int) -> bool:
    """Replay a queued what-if (whatif/runs.py)."""
    return runs.whatif_run(whatif_id, clock=timezone.now)


@shared_task
def whatifs_expire() -> int:
    """Celery beat: fail the what-ifs gone stale, delete those past their retention."""
    return runs.whatifs_expire(now=timezone.now())
