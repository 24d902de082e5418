"""Approval inbox (decide with a comment, in place through HTMX) and approval history."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from common.errors import ConflictError
from portal.decorators import login_required
from portal.forms import DecisionForm, HistoryFilterForm
from portal.templatetags.portal_tags import portal_nav
from portal.views.whatifs import with_whatifs
from scheduler.jobs.approvals import job_attempts_max
from scheduler.models import Job
from scheduler.snapshot.quota_usage import QuotaRow, quota_rows
from tenants import approvals
from tenants.models import ApprovalKind, ApprovalRequest
from tenants.selectors import approval_list_inbox, approval_list_visible

PAGE_SIZE = 25


def _jobs_asked(requests: list[ApprovalRequest]) -> dict[int, Job]:
    """The jobs the job requests ask to run, by id: one read (their flavors and spec)."""
    job_ids = [r.subject_id for r in requests if r.kind == ApprovalKind.JOB]
    return Job.objects.only("pk", "flavors", "spec").in_bulk(job_ids) if job_ids else {}


def with_decision_context(requests: list[ApprovalRequest]) -> list[ApprovalRequest]:
    """`with_team_usage` and `with_attempts`, on one read of the jobs."""
    jobs = _jobs_asked(requests)
    return with_attempts(with_team_usage(requests, jobs), jobs)


def with_team_usage(requests: list[ApprovalRequest], jobs: dict[int, Job]) -> list[ApprovalRequest]:
    """Set `team_usage` on each request: its team's quota rows (guarantee, limit, in use now)
    for the models it asks for: a quota request's flavor, a job's allowed flavors (every
    flavor the team has quota for when the job allows any), `jobs` the requests' own
    (`_jobs_asked`). One read of the quotas and their use, however many requests; the
    approver may decide for the team, so they may see its quota."""
    flavors_of_job = {pk: job.flavors for pk, job in jobs.items()}
    tenants = list({r.tenant_id: r.tenant for r in requests}.values())
    rows: dict[int, list[QuotaRow]] = {}
    for row in quota_rows(tenants):
        rows.setdefault(row.tenant.pk, []).append(row)
    for request in requests:
        if request.kind == ApprovalKind.JOB:
            asked = set(flavors_of_job.get(request.subject_id) or [])
        else:
            asked = {request.payload.get("flavor_name")}
        team = rows.get(request.tenant_id, [])
        request.team_usage = [  # type: ignore[attr-defined]
            row for row in team if not asked or row.flavor.name in asked
        ]
    return requests


def with_attempts(
    requests: list[ApprovalRequest], jobs: dict[int, Job] | None = None
) -> list[ApprovalRequest]:
    """Set `attempts` on each job request: the most attempts its job may make, which its
    GPU-hour figure (`payload.est_gpu_hours`, every attempt's) counts; None on a quota
    request. `jobs`: the requests' own when read already, else one read of them."""
    jobs = _jobs_asked(requests) if jobs is None else jobs
    attempts = {pk: job_attempts_max(job) for pk, job in jobs.items()}
    for request in requests:
        found = attempts.get(request.subject_id) if request.kind == ApprovalKind.JOB else None
        request.attempts = found  # type: ignore[attr-defined]
    return requests


def inbox_for(user: Any) -> list[ApprovalRequest] | None:
    """The user's pending requests, or None for users who never decide anything."""
    requests = with_decision_context(list(approval_list_inbox(user)[:100]))
    requests = with_whatifs(user, requests)
    if requests or _decides_anything(user):
        return requests
    return None


def _decides_anything(user: Any) -> bool:
    return bool(portal_nav(user).get("approver"))


def access_approval(user: Any, pk: int) -> ApprovalRequest:
    """A request the user may see, else 404 (the ids of other tenants' requests say nothing)."""
    try:
        return approval_list_visible(user).get(pk=pk)
    except ApprovalRequest.DoesNotExist:
        raise Http404("Not found.") from None


@login_required
@require_GET
def approval_inbox(request: HttpRequest) -> HttpResponse:
    rows = with_decision_context(list(approval_list_inbox(request.user)[:200]))
    rows = with_whatifs(request.user, rows)
    return render(request, "portal/approvals/inbox.html", {"requests": rows})


@login_required
@require_GET
def approval_history(request: HttpRequest) -> HttpResponse:
    form = HistoryFilterForm(request.GET or None)
    rows = approval_list_visible(request.user).select_related("decided_by")
    if form.is_valid():
        if form.cleaned_data["state"]:
            rows = rows.filter(state=form.cleaned_data["state"])
        if form.cleaned_data["kind"]:
            rows = rows.filter(kind=form.cleaned_data["kind"])
    page = Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page"))
    with_whatifs(request.user, with_attempts(list(page.object_list)))
    return render(request, "portal/approvals/history.html", {"filter_form": form, "page": page})


@login_required
@require_POST
def approval_decide(request: HttpRequest, pk: int) -> HttpResponse:
    """Approve or reject; HTMX swaps the inbox row for the outcome, a plain POST redirects."""
    approval = access_approval(request.user, pk)
    form = DecisionForm(request.POST)
    error = ""
    if not form.is_valid():
        error = "Choose approve or reject."
    else:
        approve = form.cleaned_data["decision"] == "approve"
        comment = form.cleaned_data["comment"]
        try:
            approval = approvals.approval_decide(
                user=request.user, request=approval, approve=approve, comment=comment
            )
        except (ConflictError, ValidationError) as exc:
            error = " ".join(getattr(exc, "messages", None) or [str(exc)])
            approval.refresh_from_db()
    if request.headers.get("HX-Request") == "true":
        context = {"req": with_attempts([approval])[0], "error": error}
        return render(request, "portal/approvals/_decided.html", context)
    if error:
        messages.error(request, error)
    else:
        messages.success(request, f"Request #{approval.pk} {approval.state}.")
    back = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        return redirect(back)
    return redirect("portal:approvals")


def pending_request_for_job(user: Any, job: Any) -> ApprovalRequest | None:
    """The job's pending request if this user may decide it (for the job page)."""
    if job.state != "pending_approval":
        return None
    request = approval_list_inbox(user).filter(kind="job", subject_id=job.pk).first()
    if request is not None:
        request.attempts = job_attempts_max(job)  # type: ignore[attr-defined]
    return request
