"""Background work of the what-if replays. Idempotent: a second delivery finds the run claimed."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from whatif import runs


# On the `reports` queue (config/settings.py CELERY_TASK_ROUTES). The soft limit ends the
# replay failed, saying so; the hard one kills a replay stuck where the soft one cannot reach
# (the sweep then fails it).
@shared_task(
    soft_time_limit=settings.GANTRY_WHATIF_TIME_LIMIT_S,
    time_limit=settings.GANTRY_WHATIF_TIME_LIMIT_S + 30,
)
def whatif_run(whatif_id: int) -> bool:
    """Replay a queued what-if (whatif/runs.py)."""
    return runs.whatif_run(whatif_id, clock=timezone.now)


@shared_task
def whatifs_expire() -> int:
    """Celery beat: fail the what-ifs gone stale, delete those past their retention."""
    return runs.whatifs_expire(now=timezone.now())
