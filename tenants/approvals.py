"""Approval policies and requests: who may decide, one decision per request, expiry.

One decide path for every kind of request (`approval_decide`, and `approval_expire_due` for
expiry): a request's subject (a job, a quota change) is settled by the handler registered for
its kind, in the same transaction that decides it. The quota handler is registered here
(`quota_request_settle`, which applies the change through `quota_set`); tenants cannot import
the scheduler, so the scheduler registers the job handler (`scheduler.jobs.approvals`, from
`scheduler.apps`).

Lock order, everywhere: the request row first (its compare-and-swap), then the subject. A job
cancel follows the same order (`approval_cancel_for_subject`, then the job), so a decision
racing a cancel cannot deadlock.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from common.errors import ConflictError, DomainError
from tenants import access, services
from tenants.approval_policies import require_manage
from tenants.approval_rules import RuleMatch, quota_matches
from tenants.audit import audit_record, audit_snapshot
from tenants.models import (
    ApprovalKind,
    ApprovalRequest,
    ApprovalState,
    Membership,
    NotificationKind,
    Quota,
    ResourceFlavor,
    Role,
    Tenant,
)
from tenants.outbox import Event, notifications_add
from tenants.quotas.changes import QuotaChange, change_of, changes_shown, values_with
from tenants.quotas.pins import validate_pinned
from tenants.quotas.rules import QuotaValues, check_own_bounds, validate_quota

logger = logging.getLogger(__name__)

MAX_COMMENT = 1000
EXPIRE_BATCH = 500

# kind -> handler(*, request, outcome, actor) run inside the deciding transaction.
SubjectHandler = Callable[..., None]
_SUBJECT_HANDLERS: dict[str, SubjectHandler] = {}


def register_subject_handler(kind: str, handler: SubjectHandler) -> None:
    """Called once by the app that owns the subject: this module for quota changes, the
    scheduler at start-up for jobs."""
    _SUBJECT_HANDLERS[kind] = handler


# --- requests ----------------------------------------------------------------------------


def _deciders(request: ApprovalRequest) -> list[str]:
    """The addresses of those who may decide `request` (see `can_decide`), but its requester;
    platform admins are left out (they decide everything and would get every request)."""
    chain = request.tenant.ancestor_ids()
    if request.kind == ApprovalKind.QUOTA:
        members = Membership.objects.filter(tenant_id__in=chain[:-1], role=Role.ADMIN)
    else:
        members = Membership.objects.filter(
            tenant_id__in=chain, role__in=(Role.APPROVER, Role.ADMIN)
        )
    found = members.exclude(user_id=request.requester_id).values_list("user__email", flat=True)
    return sorted({address for address in found if address})


def approval_needed_event(request: ApprovalRequest) -> Event:
    """The 'approval needed' notification: the tenant's webhook, and those who may decide."""
    who = request.requester.get_username()
    if request.kind == ApprovalKind.JOB:
        name = request.payload.get("job_name")
        asks = f"{who} asks to run job {name}" if name else f"{who} asks to run a job"
    else:
        flavor = request.payload.get("flavor_name")
        asks = f"{who} asks for a quota change{f' for {flavor}' if flavor else ''}"
    link = settings.GANTRY_BASE_URL.rstrip("/") + reverse("portal:approvals")
    text = f"Approval needed: {asks} in '{request.tenant.slug}'. {link}"
    return Event(
        tenant_id=request.tenant_id,
        kind=NotificationKind.APPROVAL_NEEDED,
        text=text,
        subject=f"[Gantry] approval needed in {request.tenant.slug}",
        fields={
            "request": request.pk,
            "request_kind": request.kind,
            "tenant": request.tenant.slug,
            "requester": request.requester.get_username(),
            "subject_id": request.subject_id,
            "url": link,
        },
        emails=tuple(_deciders(request)),
    )


def approval_ttl() -> timedelta:
    return timedelta(hours=float(settings.GANTRY_APPROVAL_TTL_HOURS))


def approval_request_create(
    *,
    requester: Any,
    tenant: Tenant,
    kind: str,
    subject_id: int,
    payload: dict[str, Any],
    rules: Sequence[RuleMatch | dict[str, Any]],
    now: datetime | None = None,
    subject_cluster: int = 0,
    subject_name: str = "this subject",
) -> ApprovalRequest:
    """Open a pending request. Callers check rights and call this inside their transaction.

    A second pending request for the same subject (and cluster: `subject_cluster`, a pinned
    quota's) is a ConflictError naming `subject_name` and the pending request (the partial
    unique constraint `approval_one_pending_per_subject_and_cluster` settles a race).
    """
    now = now or timezone.now()
    rows = [r.as_json() if isinstance(r, RuleMatch) else dict(r) for r in rules]
    try:
        with transaction.atomic():
            request = ApprovalRequest.objects.create(
                kind=kind,
                tenant=tenant,
                requester=requester,
                subject_id=subject_id,
                subject_cluster=subject_cluster,
                payload=payload,
                rules=rows,
                expires_at=now + approval_ttl(),
            )
            notifications_add([approval_needed_event(request)])
            return request
    except IntegrityError as exc:
        pending = ApprovalRequest.objects.filter(
            kind=kind,
            tenant=tenant,
            subject_id=subject_id,
            subject_cluster=subject_cluster,
            state=ApprovalState.PENDING,
        ).first()
        if pending is None:
            raise
        raise ConflictError(
            f"A {kind} request for {subject_name} of '{tenant.slug}' is already pending "
            f"(#{pending.pk}): wait for its decision, or withdraw it first."
        ) from exc


@transaction.atomic
def quota_request_create(
    *,
    user: Any,
    tenant: Tenant,
    flavor: ResourceFlavor,
    values: QuotaValues | QuotaChange,
    justification: str = "",
    cluster: Any = None,
) -> ApprovalRequest:
    """A tenant admin asks for a quota change; approving it applies it through `quota_set`:
    the global quota, or with `cluster` (a `scheduler.Cluster`) the one pinned to it.

    `values`: the fields the request changes (a QuotaValues names all five). The request
    carries only those; approving it changes only those, the others as the quota has them
    then (`tenants.quotas.changes`). Its payload's `changes` (field, old, new) and its audit
    entry say what it changes.

    The values are checked against the tree now (a request that could never apply is refused
    at once) and again when approved, under the parent's lock. One request per tenant,
    flavor and cluster is pending at a time: a global and a pinned one may both be.
    """
    require_manage(user, tenant)
    _check_comment(justification, "justification")
    change = change_of(values)
    rows = Quota.objects.filter(tenant=tenant, flavor=flavor)
    current = (
        rows.filter(cluster=cluster) if cluster else rows.filter(cluster__isnull=True)
    ).first()
    asked = values_with(current, change)
    parent_quota = None
    if tenant.parent_id is not None:
        parent_quota = Quota.objects.filter(
            tenant_id=tenant.parent_id, flavor=flavor, cluster__isnull=True
        ).first()
    # A team admin asks for the team's quota without seeing the parent's subtree: the errors
    # must not show the siblings' guarantees or the parent's figures.
    sees_parent = tenant.parent_id is None or (
        access.tenants_visible(user).filter(pk=tenant.parent_id).exists()
    )
    if cluster is not None:
        _validate_pin_request(tenant, flavor, cluster, asked, parent_quota, sees_parent)
    else:
        validate_quota(tenant, flavor, asked, parent_quota, reveal_parent=sees_parent)
    shown = changes_shown(current, change)
    payload = {
        "flavor": flavor.pk,
        "flavor_name": flavor.name,
        "cluster": cluster.pk if cluster is not None else None,
        "cluster_name": cluster.name if cluster is not None else None,
        "values": change,  # only the named fields: what approving it changes
        "changes": shown,
        "current": audit_snapshot(current, QUOTA_FIELDS),
        "justification": justification,
    }
    request = approval_request_create(
        requester=user,
        tenant=tenant,
        kind=ApprovalKind.QUOTA,
        subject_id=flavor.pk,
        payload=payload,
        rules=quota_matches(tenant, asked),
        subject_cluster=cluster.pk if cluster is not None else 0,
        subject_name=flavor.name + (f" on cluster {cluster.name}" if cluster else " (global)"),
    )
    audit_record(
        actor=user,
        action="quota.request",
        tenant=tenant,
        target=request,
        # The named fields only: what the request changes, old -> new.
        before=None if current is None else {c["field"]: c["old"] for c in shown},
        after={**{c["field"]: c["new"] for c in shown}, "cluster": payload["cluster"]},
    )
    return request


def _validate_pin_request(
    tenant: Tenant,
    flavor: ResourceFlavor,
    cluster: Any,
    values: QuotaValues,
    parent_quota: Quota | None,
    sees_parent: bool,
) -> None:
    """The pin rules (`tenants.quotas.pins`). For a requester who cannot see the parent, an
    error that involves the parent or the siblings is said without their figures."""
    try:
        validate_pinned(tenant, flavor, cluster, values, parent_quota)
    except ValidationError as exc:
        if sees_parent:
            raise
        own = check_own_bounds(tenant, values)
        parent = tenant.parent
        assert parent is not None  # a root tenant's parent is seen by everyone
        hidden = (
            f"does not fit what '{parent.slug}' holds for {flavor.name} on cluster "
            f"{cluster.name}, or the global quota of '{tenant.slug}'; ask a smaller value or "
            f"an admin of '{parent.slug}'."
        )
        raise ValidationError(
            {
                name: own.get(name)
                or [f"'{tenant.slug}' asks for a {name.removesuffix('_milli')} that {hidden}"]
                for name in exc.message_dict
            }
        ) from None


def _cluster_of(request: ApprovalRequest) -> Any:
    """The cluster a quota request pins to, or None (global). Through the relation: tenants
    imports nothing of scheduler, where clusters live. A cluster removed since is a
    ValidationError: the request stays pending."""
    pk = request.payload.get("cluster")
    if pk is None:
        return None
    model = Quota._meta.get_field("cluster").related_model
    found = model._default_manager.filter(pk=pk).first()  # type: ignore[union-attr]
    if found is None:
        name = request.payload.get("cluster_name") or pk
        raise ValidationError({"cluster": [f"cluster {name} no longer exists."]})
    return found


QUOTA_FIELDS = ("guaranteed_milli", "limit_milli", "lend_limit_milli", "weight", "user_limit_milli")


def quota_request_settle(*, request: ApprovalRequest, outcome: str, actor: Any) -> None:
    """Apply an approved quota change through `quota_set` (checked again against the tree,
    under the parent's lock): the fields the request named, the others as the quota has them
    now (a request made before requests named fields named all five). A rejection or expiry
    changes nothing more. Runs inside the deciding transaction, so a change that no longer
    fits leaves the request pending."""
    if outcome == ApprovalState.APPROVED:
        flavor = ResourceFlavor.objects.get(pk=request.subject_id)
        services.quota_set(
            user=actor,
            tenant=request.tenant,
            flavor=flavor,
            values=dict(request.payload["values"]),
            cluster=_cluster_of(request),
        )


register_subject_handler(ApprovalKind.QUOTA, quota_request_settle)


# --- deciding ----------------------------------------------------------------------------


def can_decide(user: Any, request: ApprovalRequest) -> bool:
    """Approvers and admins of the tenant or above decide job requests; quota requests are
    decided by whoever may set that quota (an admin above the tenant). Platform admins decide
    both. Nobody decides their own request."""
    if user is None or not user.is_authenticated or request.requester_id == user.pk:
        return False
    grants = access.grants_for(user)
    if grants.platform_admin:
        return True
    if request.kind == ApprovalKind.QUOTA:
        return access.can_set_quota(user, request.tenant)
    return grants.role_on(request.tenant) in (Role.APPROVER, Role.ADMIN)


def _check_comment(text: str, name: str = "comment") -> None:
    if len(text) > MAX_COMMENT:
        raise ValidationError({name: [f"at most {MAX_COMMENT} characters."]})
    for ch in text:
        if unicodedata.category(ch) in {"Cc", "Cf"} and ch not in "\n\t":
            raise ValidationError({name: [f"contains the control character U+{ord(ch):04X}."]})


@transaction.atomic
def approval_decide(
    *, user: Any, request: ApprovalRequest, approve: bool, comment: str
) -> ApprovalRequest:
    """Approve or reject a pending request and apply the outcome, in one transaction.

    Two approvers acting at once: the compare-and-swap on state=pending lets exactly one
    through; the other gets ConflictError. A request past its expiry cannot be decided.
    Applying may fail (a quota that no longer fits): then nothing changes and the request
    stays pending.
    """
    # 1. who may decide
    if request.requester_id == getattr(user, "pk", None):
        raise PermissionDenied("You cannot approve or reject your own request.")
    if not can_decide(user, request):
        raise PermissionDenied(
            f"Only approvers of '{request.tenant.slug}' or above may decide this request."
        )
    _check_comment(comment)
    # 2. compare-and-swap: one decision lands
    now = timezone.now()
    outcome = ApprovalState.APPROVED if approve else ApprovalState.REJECTED
    changed = ApprovalRequest.objects.filter(
        pk=request.pk, state=ApprovalState.PENDING, expires_at__gt=now
    ).update(state=outcome, decided_by=user, decided_at=now, comment=comment, updated_at=now)
    if changed != 1:
        raise ConflictError(_why_not_pending(request.pk))
    request.refresh_from_db()
    # 3. apply the outcome to the subject
    _apply(request, outcome=outcome, actor=user)
    # 4. record and notify
    audit_record(
        actor=user,
        action="approval.decide",
        tenant=request.tenant,
        target=request,
        before={"state": ApprovalState.PENDING},
        after={"state": outcome, "comment": comment},
    )
    _notify_on_commit(request.pk)
    return request


def _why_not_pending(pk: int) -> str:
    current = ApprovalRequest.objects.select_related("decided_by").filter(pk=pk).first()
    if current is None:
        return f"Approval request {pk} no longer exists."
    if current.state == ApprovalState.PENDING:
        return f"Approval request {pk} has expired; nothing was changed."
    who = f" by {current.decided_by.get_username()}" if current.decided_by else ""
    return f"Approval request {pk} was already {current.state}{who}; nothing was changed."


def _apply(request: ApprovalRequest, *, outcome: str, actor: Any) -> None:
    handler = _SUBJECT_HANDLERS.get(request.kind)
    if handler is None:
        raise ImproperlyConfigured(f"No handler is registered for {request.kind} requests.")
    handler(request=request, outcome=outcome, actor=actor)


def approval_cancel_for_subject(*, kind: str, tenant: Tenant, subject_id: int, actor: Any) -> bool:
    """Withdraw the pending request of a subject that went away (a job being cancelled).

    Runs inside the caller's transaction, before the caller touches the subject (lock order).
    Returns whether a pending request was withdrawn.
    """
    now = timezone.now()
    decided_by = actor if getattr(actor, "is_authenticated", False) else None
    changed = ApprovalRequest.objects.filter(
        kind=kind, tenant=tenant, subject_id=subject_id, state=ApprovalState.PENDING
    ).update(
        state=ApprovalState.CANCELLED,
        decided_by=decided_by,
        decided_at=now,
        comment="withdrawn",
        updated_at=now,
    )
    return changed > 0


@transaction.atomic
def approval_withdraw(*, user: Any, request: ApprovalRequest) -> ApprovalRequest:
    """The requester (or an admin of the tenant) withdraws a pending quota request.

    A job's request is withdrawn by cancelling the job (`scheduler.jobs.services.job_cancel`).
    """
    if request.kind != ApprovalKind.QUOTA:
        raise DomainError("Cancel the job to withdraw its approval request.")
    if request.requester_id != user.pk and not access.can_manage_tenant(user, request.tenant):
        raise PermissionDenied("Only the requester or an admin may withdraw this request.")
    now = timezone.now()
    changed = ApprovalRequest.objects.filter(pk=request.pk, state=ApprovalState.PENDING).update(
        state=ApprovalState.CANCELLED,
        decided_by=user,
        decided_at=now,
        comment="withdrawn",
        updated_at=now,
    )
    if changed != 1:
        raise ConflictError(_why_not_pending(request.pk))
    request.refresh_from_db()
    audit_record(
        actor=user,
        action="approval.withdraw",
        tenant=request.tenant,
        target=request,
        before={"state": ApprovalState.PENDING},
        after={"state": ApprovalState.CANCELLED},
    )
    return request


# --- expiry ------------------------------------------------------------------------------


def approval_expire_due(now: datetime) -> int:
    """Expire pending requests whose time is up; returns how many this call expired.

    Safe to run twice at once (two beat processes, docs/faults.md 10): each request is expired by a
    compare-and-swap in its own transaction, so the second runner finds nothing to do.
    """
    due = list(
        ApprovalRequest.objects.filter(state=ApprovalState.PENDING, expires_at__lte=now)
        .order_by("expires_at", "pk")
        .values_list("pk", flat=True)[:EXPIRE_BATCH]
    )
    expired = 0
    for pk in due:
        try:
            expired += _expire_one(pk, now)
        except ConflictError as exc:  # the subject moved on; the request stays for next time
            logger.warning("approval request %s not expired: %s", pk, exc)
    return expired


@transaction.atomic
def _expire_one(pk: int, now: datetime) -> bool:
    changed = ApprovalRequest.objects.filter(
        pk=pk, state=ApprovalState.PENDING, expires_at__lte=now
    ).update(
        state=ApprovalState.EXPIRED, decided_at=now, comment="approval expired", updated_at=now
    )
    if not changed:
        return False
    request = ApprovalRequest.objects.select_related("tenant").get(pk=pk)
    _apply(request, outcome=ApprovalState.EXPIRED, actor=None)
    audit_record(
        actor=None,
        action="approval.expire",
        tenant=request.tenant,
        target=request,
        before={"state": ApprovalState.PENDING},
        after={"state": ApprovalState.EXPIRED},
    )
    _notify_on_commit(pk)
    return True


# --- notifications -----------------------------------------------------------------------


def _notify_on_commit(request_id: int) -> None:
    transaction.on_commit(lambda: enqueue_notification(request_id))


def enqueue_notification(request_id: int) -> None:
    """Queue the requester's email. A broker that is down costs a log line, never the request
    (docs/faults.md 8): the state is committed and the expiry sweep sends what was not sent."""
    from tenants.tasks import approval_notify  # tasks import this module

    try:
        approval_notify.delay(request_id)
    except Exception:  # any broker error
        logger.warning(
            "could not queue the notification of approval request %s", request_id, exc_info=True
        )
