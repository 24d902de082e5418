"""Emails to requesters when their approval request is decided or expires."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import F
from django.urls import reverse

from tenants.models import ApprovalKind, ApprovalRequest, ApprovalState

# How far back the sweep looks for decisions whose email was never sent.
RESEND_WINDOW = timedelta(days=7)


def _subject_line(request: ApprovalRequest) -> tuple[str, str]:
    """What was asked for, as its owner knows it, and the absolute address of its page (the
    job's, or the approval history's for a quota request)."""
    base = settings.GANTRY_BASE_URL.rstrip("/")
    if request.kind == ApprovalKind.JOB:
        name = request.payload.get("job_name")
        what = f"job {name} (#{request.subject_id})" if name else f"job #{request.subject_id}"
        return what, base + reverse("portal:job-detail", args=[request.subject_id])
    flavor = request.payload.get("flavor_name")
    what = f"quota request for {flavor}" if flavor else f"{request.kind} request"
    return what, base + reverse("portal:approval-history")


def _message(request: ApprovalRequest) -> tuple[str, str]:
    what, link = _subject_line(request)
    subject = f"[Gantry] {what}: {request.state}"
    lines = [f"Your {what} in '{request.tenant.slug}' was {request.state}."]
    if request.decided_by is not None and request.state != ApprovalState.CANCELLED:
        lines.append(f"Decided by: {request.decided_by.get_username()}")
    if request.comment:
        lines.append(f"Comment: {request.comment}")
    if request.reasons:
        lines.append("It needed approval because it " + "; ".join(request.reasons) + ".")
    lines.append(f"See it at {link}")
    return subject, "\n".join(lines) + "\n"


@transaction.atomic
def approval_notification_send(request_id: int) -> bool:
    """Email the requester about the request's final state, once per state.

    Idempotent (a task delivered twice, docs/faults.md 9): the row lock serialises two deliveries
    and `notified_state` records what was sent, so the second finds nothing to do. A mail error
    rolls back the mark, so a retry sends it again. Returns whether an email went out.
    """
    request = (
        ApprovalRequest.objects.select_for_update(of=("self",))
        .select_related("requester", "decided_by", "tenant")
        .filter(pk=request_id)
        .first()
    )
    if request is None or request.state == ApprovalState.PENDING:
        return False
    if request.notified_state == request.state:
        return False
    sent = False
    if request.requester.email and request.state != ApprovalState.CANCELLED:
        subject, body = _message(request)
        send_mail(subject, body, None, [request.requester.email])
        sent = True
    request.notified_state = request.state
    request.save(update_fields=["notified_state", "updated_at"])
    return sent


def approval_notification_ids_unsent(now: datetime) -> list[int]:
    """Recently settled requests whose email was not sent (the broker was down, say)."""
    return list(
        ApprovalRequest.objects.exclude(state=ApprovalState.PENDING)
        .exclude(state=ApprovalState.CANCELLED)
        .filter(decided_at__gte=now - RESEND_WINDOW)
        .exclude(notified_state=F("state"))
        .values_list("pk", flat=True)[:500]
    )
