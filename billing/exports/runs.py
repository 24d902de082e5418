"""Large finance exports as Celery work: start, run, read, expire (docs/billing.md "Exports").

The lifecycle: `cost_export_start` records a queued export and, once its transaction commits,
queues `billing.tasks.cost_export_run`. The task claims it (queued -> running, a
compare-and-swap, so a second delivery of the same message does nothing), writes the file
under `GANTRY_EXPORT_DIR` through a temporary name, saving progress as rows go, and renames it
when complete (a crash leaves no half file under the final name; a worker killed while
writing leaves the export `running` and its partial file until the export expires). What the
file holds is decided when it runs: `export_write` reads the cost lines its owner may see at
that moment.
What one person may start is bounded (common/run_limits.py): one export queued or running at
a time, and GANTRY_EXPORT_RUNS_PER_DAY a sliding day; past either a 429 says when to try again.
An export has GANTRY_EXPORT_TIME_LIMIT_S: the task's Celery time limits, and the same limit
checked where its progress is saved (the embedded worker's thread pool has no Celery time
limits); past it the export ends failed, saying so, and one whose worker was killed is failed
by the sweep.
Each export is kept `GANTRY_EXPORT_RETENTION_H` hours after it finishes; the beat task
`cost_exports_expire` then deletes the file and the row, and a download after the expiry is a
404 even before the sweep.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404

from billing.exports.formats import export_write, filename, query_from_json, query_to_json
from billing.models import CostExport, ExportState
from common.errors import DomainError
from common.run_limits import runs_allowed

logger = logging.getLogger(__name__)


def export_dir() -> Path:
    return Path(settings.GANTRY_EXPORT_DIR)


def retention() -> timedelta:
    return timedelta(hours=settings.GANTRY_EXPORT_RETENTION_H)


ACTIVE = (ExportState.QUEUED, ExportState.RUNNING)
# An export still queued or running this long after it was asked for has lost its worker or
# its message (its time limit is far shorter): the sweep, and its owner's next start, fail it.
STALE_AFTER = timedelta(hours=2)


def time_limit() -> timedelta:
    return timedelta(seconds=settings.GANTRY_EXPORT_TIME_LIMIT_S)


def time_limit_message() -> str:
    return (
        f"stopped: the export ran past its time limit of {time_limit().total_seconds():.0f} s; "
        "narrow the window or the filters."
    )


class ExportTimeLimit(Exception):
    """The export went past its time limit (checked where its progress is saved)."""


def cost_export_start(*, user: Any, fmt: str, query: dict[str, Any], now: datetime) -> CostExport:
    """Record an export of the validated cost query within its owner's allowances
    (RateLimitedError past them) and queue its task after the commit."""
    mine = CostExport.objects.filter(owner_id=user.pk)
    with transaction.atomic():
        # One start at a time per person: the check and the insert are not split by another.
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        _fail_stale(now, mine)
        runs_allowed(
            active=mine.filter(state__in=ACTIVE),
            started=mine,
            per_day=settings.GANTRY_EXPORT_RUNS_PER_DAY,
            now=now,
            noun="export",
            whose="Your",
        )
        export = _create(user=user, fmt=fmt, query=query, now=now)
    transaction.on_commit(lambda: enqueue_export(export.pk))
    return export


def _create(*, user: Any, fmt: str, query: dict[str, Any], now: datetime) -> CostExport:
    return CostExport.objects.create(
        owner=user,
        query=query_to_json(query),
        format=fmt,
        filename=filename(fmt, query),
        created_at=now,
        expires_at=now + retention(),
    )


def enqueue_export(export_id: int) -> None:
    """Queue the task. A broker that is down costs the export, not the request: it is
    marked failed, with the reason, for its owner to start again."""
    from billing.tasks import cost_export_run  # the tasks import this module

    try:
        cost_export_run.delay(export_id)
    except Exception:  # any broker error
        logger.warning("could not queue cost export %s", export_id, exc_info=True)
        CostExport.objects.filter(pk=export_id, state=ExportState.QUEUED).update(
            state=ExportState.FAILED, error="could not be queued; start it again."
        )


def cost_export_run(export_id: int, *, clock: Callable[[], datetime]) -> bool:
    """Write the export's file. False when there is nothing to do: gone, or claimed by
    another run already. `clock` stamps when it finished (its retention starts then)."""
    started = clock()
    claimed = CostExport.objects.filter(pk=export_id, state=ExportState.QUEUED).update(
        state=ExportState.RUNNING
    )
    if not claimed:
        return False
    deadline = started + time_limit()
    export = CostExport.objects.select_related("owner").get(pk=export_id)
    folder = export_dir()
    folder.mkdir(parents=True, exist_ok=True)
    final = f"{export.pk}-{export.filename}"
    partial = folder / f".{final}.part"

    def progress(done: int, total: int) -> None:
        if clock() > deadline:
            raise ExportTimeLimit()
        CostExport.objects.filter(pk=export_id).update(progress_done=done, progress_total=total)

    try:
        with partial.open("wb") as out:
            rows = export_write(
                user=export.owner,
                fmt=export.format,
                query=query_from_json(export.query),
                out=out,
                progress=progress,
            )
        os.replace(partial, folder / final)
    except DomainError as problem:
        partial.unlink(missing_ok=True)
        _finish(export_id, clock(), state=ExportState.FAILED, error=str(problem)[:500])
        return True
    except (SoftTimeLimitExceeded, ExportTimeLimit):
        logger.warning("cost export %s ran past its time limit", export_id)
        partial.unlink(missing_ok=True)
        _finish(export_id, clock(), state=ExportState.FAILED, error=time_limit_message())
        return True
    except Exception:
        partial.unlink(missing_ok=True)
        _finish(
            export_id, clock(), state=ExportState.FAILED, error="the export failed; see the logs."
        )
        raise
    _finish(
        export_id,
        clock(),
        state=ExportState.DONE,
        file=final,
        size=(folder / final).stat().st_size,
        rows=rows,
    )
    return True


def _finish(export_id: int, now: datetime, **fields: Any) -> None:
    CostExport.objects.filter(pk=export_id).update(
        finished_at=now, expires_at=now + retention(), **fields
    )


def _fail_stale(now: datetime, exports: QuerySet[CostExport]) -> None:
    """Fail the exports among `exports` still queued or running STALE_AFTER after they were
    asked for: a worker killed by the hard time limit, or lost, never says so."""
    exports.filter(state__in=ACTIVE, created_at__lte=now - STALE_AFTER).update(
        state=ExportState.FAILED,
        error="the export stopped without a file (its worker was stopped at its time limit, "
        "or lost); start it again.",
        finished_at=now,  # kept until its expiry as asked, for its owner to read why
    )


def cost_exports_expire(*, now: datetime) -> int:
    """Fail the exports gone stale, then delete the files and rows of exports past their
    expiry; the number deleted. Safe to run twice at once: a file already gone is no error,
    a row already deleted is skipped."""
    _fail_stale(now, CostExport.objects.all())
    expired = list(CostExport.objects.filter(expires_at__lte=now).values_list("pk", "file"))
    folder = export_dir()
    for pk, name in expired:
        if name:
            (folder / name).unlink(missing_ok=True)
        # What a worker killed while writing left (its export stays `running` until now).
        for partial in folder.glob(f".{pk}-*.part"):
            partial.unlink(missing_ok=True)
    CostExport.objects.filter(pk__in=[pk for pk, _ in expired]).delete()
    return len(expired)


# --- reads ----------------------------------------------------------------------------------


def cost_export_list_visible(user: Any) -> QuerySet[CostExport]:
    """The user's own exports: an export is its owner's alone, whatever their role."""
    return CostExport.objects.filter(owner_id=user.pk)


def access_cost_export(user: Any, export_id: Any) -> CostExport:
    """The user's own export; anything else is a 404."""
    try:
        return cost_export_list_visible(user).get(pk=int(export_id))
    except (ValueError, TypeError, CostExport.DoesNotExist):
        raise Http404("Not found.") from None


def cost_export_file(user: Any, export_id: Any, *, now: datetime) -> tuple[CostExport, Path]:
    """The user's finished, unexpired export and its file; anything else is a 404."""
    export = access_cost_export(user, export_id)
    path = export_dir() / export.file
    if export.state != ExportState.DONE or export.expires_at <= now or not path.is_file():
        raise Http404("Not found.")
    return export, path
