"""What-if runs: start, run (the Celery task's body), read, expire (docs/what-if.md).

Like the finance exports (`billing.exports.runs`): `whatif_start` records a queued run and
queues `whatif.tasks.whatif_run` once its transaction commits; the task claims it (queued ->
running, a compare-and-swap, so a second delivery does nothing), replays, and records the
results or the error. Progress is written from inside the replay, at most once every
`every_cycles` cycles and only when the percentage moved.

What one person may start is bounded (common/run_limits.py): one run queued or running at a
time per person (also a constraint of the table), and GANTRY_WHATIF_RUNS_PER_DAY a day per
scope (a tenant, or the whole platform). A run has GANTRY_WHATIF_TIME_LIMIT_S: the task's
Celery time limits, and the same limit checked by the replay's progress writer (the embedded
worker's thread pool has no Celery time limits); a run past it ends failed, saying so, and
one whose worker was killed is failed by the sweep.

Who sees a run: platform admins and finance all (finance starts none: a 403); a tenant
admin the runs scoped to their subtree (runs linked to a quota request are scoped to the
parent of the requesting tenant, where its deciders are admins). Members and approvers
without an admin role: the whole feature is a 404.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.http import Http404

from common.errors import RateLimitedError
from common.run_limits import BUSY_RETRY_S, runs_allowed
from tenants import access
from tenants.approvals import can_decide
from tenants.models import ApprovalKind, ApprovalRequest, Role, Tenant
from whatif.models import WhatIf, WhatIfState
from whatif.proposal import changes_validate, expansion_validate
from whatif.replay import replay

logger = logging.getLogger(__name__)


ACTIVE = (WhatIfState.QUEUED, WhatIfState.RUNNING)


def retention() -> timedelta:
    return timedelta(days=settings.GANTRY_WHATIF_RETENTION_DAYS)


def time_limit() -> timedelta:
    return timedelta(seconds=settings.GANTRY_WHATIF_TIME_LIMIT_S)


def time_limit_message() -> str:
    return (
        f"stopped: the replay ran past its time limit of {time_limit().total_seconds():.0f} s; "
        "replay fewer days or a smaller scope."
    )


# --- who -----------------------------------------------------------------------------------


def _admin_paths(user: Any) -> list[str]:
    grants = access.grants_for(user)
    return [path for path, role in grants.roles_by_path.items() if role == Role.ADMIN]


def may_use_whatif(user: Any) -> bool:
    return access.grants_for(user).sees_everything or bool(_admin_paths(user))


def may_start(user: Any) -> bool:
    return access.grants_for(user).platform_admin or bool(_admin_paths(user))


def require_whatif_starter(user: Any) -> None:
    """Finance reads the runs and starts none; the rest are as `require_whatif_user`."""
    require_whatif_user(user)
    if not may_start(user):
        raise PermissionDenied("Finance reads what-ifs; platform and tenant admins start them.")


def require_whatif_user(user: Any) -> None:
    """The whole feature is a 404 to anyone neither a platform nor a tenant admin."""
    if not may_use_whatif(user):
        raise Http404("Not found.")


def whatif_list_visible(user: Any) -> QuerySet[WhatIf]:
    runs = WhatIf.objects.select_related("scope", "requested_by", "approval")
    if access.grants_for(user).sees_everything:
        return runs
    query = Q(pk__in=[])
    for path in _admin_paths(user):
        query |= Q(scope__path__startswith=path)
    return runs.filter(query)


def access_whatif(user: Any, whatif_id: Any) -> WhatIf:
    try:
        return whatif_list_visible(user).get(pk=int(whatif_id))
    except (ValueError, TypeError, WhatIf.DoesNotExist):
        raise Http404("Not found.") from None


def scope_choices(user: Any) -> QuerySet[Tenant]:
    """The tenants a user may scope a run to: those they administer (and their subtrees)."""
    if access.grants_for(user).platform_admin:
        return Tenant.objects.all()
    query = Q(pk__in=[])
    for path in _admin_paths(user):
        query |= Q(path__startswith=path)
    return Tenant.objects.filter(query)


# --- start ---------------------------------------------------------------------------------


def whatif_start(
    *,
    user: Any,
    scope_id: int | None,
    window_days: int,
    changes: list[dict[str, Any]],
    now: datetime,
) -> WhatIf:
    """Record a run of the validated changes and queue it after the commit."""
    require_whatif_starter(user)
    scope = _scope(user, scope_id)
    changes_validate(user=user, scope=scope, changes=changes)
    return _create(user=user, scope=scope, window_days=window_days, changes=changes, now=now)


def _scope(user: Any, scope_id: int | None) -> Tenant | None:
    if scope_id is None:
        if access.grants_for(user).platform_admin:
            return None
        raise ValidationError({"scope": ["choose a tenant you administer."]})
    scope = scope_choices(user).filter(pk=scope_id).first()
    if scope is None:
        raise ValidationError({"scope": [f"unknown tenant {scope_id}, or not one you administer."]})
    return scope


def whatif_expansion_start(
    *, user: Any, window_days: int, changes: list[dict[str, Any]], now: datetime
) -> WhatIf:
    """Record a run of an expansion (whatif/inventory.py: the inventory changed, the demand
    scaled to a forecast) over the whole platform, and queue it. Platform admins only: the
    inventory is theirs (capacity/expansions.py proposes these from its forecasts)."""
    if not access.grants_for(user).platform_admin:
        raise PermissionDenied("Platform admins propose changes to the GPU inventory.")
    expansion_validate(changes)
    return _create(user=user, scope=None, window_days=window_days, changes=changes, now=now)


def may_replay_approval(user: Any, request: ApprovalRequest) -> bool:
    return request.kind == ApprovalKind.QUOTA and can_decide(user, request)


def whatif_for_approval(
    *, user: Any, request: ApprovalRequest, window_days: int, now: datetime
) -> WhatIf:
    """The run replaying a quota request's change: the one already kept for it (but failed
    ones), else a new one. Its deciders only (`can_decide`); anyone else gets a 404."""
    if not may_replay_approval(user, request):
        raise Http404("Not found.")
    kept = request.what_ifs.exclude(state=WhatIfState.FAILED).order_by("-created_at").first()
    if kept is not None:
        return kept
    values = request.payload.get("values", {})
    pinned_to = request.payload.get("cluster_name")
    # A pinned quota sets a guarantee and a limit only (whatif.proposal checks it). A request
    # carries only the fields it names (tenants.quotas.changes): the others are the quota's
    # own in the replay, as they would be once approved.
    fields: tuple[str, ...] = ("guaranteed_milli", "limit_milli")
    if not pinned_to:
        fields += ("lend_limit_milli", "weight", "user_limit_milli")
    change = {
        "kind": "quota",
        "tenant": request.tenant.slug,
        "flavor": request.payload.get("flavor_name", ""),
        **({"cluster": pinned_to} if pinned_to else {}),
        **{k: values[k] for k in fields if k in values},
    }
    scope = request.tenant.parent
    return _create(
        user=user, scope=scope, window_days=window_days, changes=[change], now=now, approval=request
    )


def _create(
    *,
    user: Any,
    scope: Tenant | None,
    window_days: int,
    changes: list[dict[str, Any]],
    now: datetime,
    approval: ApprovalRequest | None = None,
) -> WhatIf:
    """Record a run within the allowances (RateLimitedError past them) and queue it."""
    with transaction.atomic():
        if scope is not None:  # one start at a time per scope, for its day's count
            Tenant.objects.select_for_update().filter(pk=scope.pk).first()
        _fail_stale(now, WhatIf.objects.filter(requested_by=user))
        runs_allowed(
            active=WhatIf.objects.filter(requested_by=user, state__in=ACTIVE),
            started=WhatIf.objects.filter(scope=scope)
            if scope is not None
            else WhatIf.objects.filter(scope__isnull=True),
            per_day=settings.GANTRY_WHATIF_RUNS_PER_DAY,
            now=now,
            noun="what-if run",
            whose=f"{scope.slug}'s" if scope is not None else "The platform-wide runs'",
        )
        try:
            with transaction.atomic():
                run = WhatIf.objects.create(
                    requested_by=user,
                    scope=scope,
                    window_days=window_days,
                    changes=changes,
                    approval=approval,
                    created_at=now,
                    expires_at=now + retention(),
                )
        except IntegrityError:  # a start of the same person's at the same moment won
            raise RateLimitedError(
                "Your other what-if run is queued or running; one at a time.",
                retry_after_s=BUSY_RETRY_S,
            ) from None
    transaction.on_commit(lambda: enqueue(run.pk))
    return run


def enqueue(whatif_id: int) -> None:
    """Queue the task. A broker that is down costs the run, not the request: it is marked
    failed, with the reason, for its owner to start again."""
    from whatif.tasks import whatif_run  # the tasks import this module

    try:
        whatif_run.delay(whatif_id)
    except Exception:  # any broker error
        logger.warning("could not queue what-if %s", whatif_id, exc_info=True)
        WhatIf.objects.filter(pk=whatif_id, state=WhatIfState.QUEUED).update(
            state=WhatIfState.FAILED, error="could not be queued; start it again."
        )


# --- run -----------------------------------------------------------------------------------


class RunTimeLimit(Exception):
    """The run went past its time limit (checked where its progress is written)."""


class ProgressWriter:
    """Writes a running what-if's progress: only when the percentage moved (the replay tells
    it every `every_cycles` cycles), so a long replay costs a bounded number of writes. Past
    `deadline` (by `clock`) it raises RunTimeLimit, which ends the replay."""

    def __init__(
        self,
        whatif_id: int,
        *,
        clock: Callable[[], datetime] | None = None,
        deadline: datetime | None = None,
    ) -> None:
        self.whatif_id, self.last = whatif_id, -1
        self.clock, self.deadline = clock, deadline
        self.written: list[tuple[int, str]] = []

    def __call__(self, percent: int, stage: str) -> None:
        if self.clock is not None and self.deadline is not None and self.clock() > self.deadline:
            raise RunTimeLimit(stage)
        if percent == self.last:
            return
        self.last = percent
        self.written.append((percent, stage))
        WhatIf.objects.filter(pk=self.whatif_id, state=WhatIfState.RUNNING).update(
            progress=min(percent, 99), stage=stage[:200]
        )


def whatif_run(
    whatif_id: int,
    *,
    clock: Callable[[], datetime],
    every_cycles: int = 50,
    writer: ProgressWriter | None = None,
) -> bool:
    """Replay a queued run. False when there is nothing to do: gone, or claimed already. A
    run past its time limit (the task's soft limit, or the writer's deadline) ends failed."""
    started = clock()
    claimed = WhatIf.objects.filter(pk=whatif_id, state=WhatIfState.QUEUED).update(
        state=WhatIfState.RUNNING, started_at=started
    )
    if not claimed:
        return False
    run = WhatIf.objects.get(pk=whatif_id)
    writer = writer or ProgressWriter(whatif_id, clock=clock, deadline=started + time_limit())
    try:
        results = replay(
            changes=run.changes,
            window_days=run.window_days,
            now=run.created_at,
            progress=writer,
            every_cycles=every_cycles,
        )
    except (SoftTimeLimitExceeded, RunTimeLimit):
        logger.warning("what-if %s ran past its time limit", whatif_id)
        _finish(whatif_id, clock(), state=WhatIfState.FAILED, error=time_limit_message())
        return True
    except Exception as problem:  # the run records why; the worker goes on
        logger.exception("what-if %s failed", whatif_id)
        _finish(
            whatif_id,
            clock(),
            state=WhatIfState.FAILED,
            error=f"the replay failed: {problem}"[:500],
        )
        return True
    _finish(whatif_id, clock(), state=WhatIfState.DONE, results=results, progress=100, stage="done")
    return True


def _finish(whatif_id: int, now: datetime, **fields: Any) -> None:
    WhatIf.objects.filter(pk=whatif_id).update(
        finished_at=now, expires_at=now + retention(), **fields
    )


# A replay is bounded (GANTRY_WHATIF_MAX_JOBS); one still queued or running this long after it
# was asked for has lost its message or its worker (a redelivered message finds the run
# claimed and does nothing), and would otherwise show a progress bar until it expires.
STALE_AFTER = timedelta(hours=6)


# A running replay is given this long past its time limit (the task's hard limit, a slow
# last write) before the sweep calls its worker lost.
LIMIT_GRACE = timedelta(minutes=2)


def _fail_stale(now: datetime, runs: QuerySet[WhatIf]) -> None:
    """Fail the runs among `runs` that can no longer finish: queued or running STALE_AFTER
    after they were asked for, or running past their time limit (a worker killed by the hard
    limit, or lost, never says so)."""
    lost = runs.filter(state__in=ACTIVE, created_at__lte=now - STALE_AFTER)
    lost.update(
        state=WhatIfState.FAILED,
        error="the replay stopped without a result (its worker or its message was lost); "
        "start it again.",
        finished_at=now,
        expires_at=now + retention(),
    )
    overdue = runs.filter(
        state=WhatIfState.RUNNING, started_at__lte=now - time_limit() - LIMIT_GRACE
    )
    overdue.update(
        state=WhatIfState.FAILED,
        error=time_limit_message(),
        finished_at=now,
        expires_at=now + retention(),
    )


def whatifs_expire(*, now: datetime) -> int:
    """Mark the runs gone stale failed, and delete the runs past their retention; the number
    deleted. Safe to run twice at once: each is a single conditional statement."""
    _fail_stale(now, WhatIf.objects.all())
    deleted, _ = WhatIf.objects.filter(expires_at__lte=now).delete()
    return deleted
