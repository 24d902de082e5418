"""Job pages: list (with a polled rows partial), submit, detail (with a polled status), cancel."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from rest_framework.exceptions import ValidationError as SpecError

from billing.costs.job import job_cost_so_far
from billing.costs.quotes import job_quote
from common.errors import ConflictError
from portal import selectors
from portal.dashboard_charts import job_figure
from portal.decorators import login_required
from portal.forms import TYPE_DEFAULTS, CancelForm, JobFilterForm, JobSubmitForm
from portal.views.approvals import pending_request_for_job
from scheduler.jobs.pods import job_pod_list
from scheduler.jobs.reasons import ReasonReader
from scheduler.jobs.selectors import (
    QueuePosition,
    access_job,
    job_event_list,
    job_list_visible,
    job_queue_note,
    job_queue_position,
    may_read_job_logs,
)
from scheduler.jobs.services import can_cancel, job_cancel, job_submit
from scheduler.jobs.spec import spec_errors
from scheduler.telemetry.job_dashboard import job_utilization
from tenants import access
from tenants.models import JobType

PAGE_SIZE = 25
POLL_SECONDS = 5


def _submittable_projects(user: Any) -> list[Any]:
    projects = (
        access.projects_visible(user).select_related("tenant").order_by("tenant__path", "slug")
    )
    return [p for p in projects if access.can_submit(user, p)]


def _filtered_jobs(request: HttpRequest) -> tuple[JobFilterForm, Any]:
    """The visible jobs narrowed by the filter form. A project the user cannot see is a 404."""
    projects = list(access.projects_visible(request.user).select_related("tenant"))
    form = JobFilterForm(request.GET or None, projects=projects)
    jobs = job_list_visible(request.user)
    project_id = request.GET.get("project")
    if project_id:
        # Checked before the form so a foreign id is a 404, as on every other route.
        jobs = jobs.filter(project=access.access_project(request.user, project_id))
    if form.is_bound and form.is_valid():
        if form.cleaned_data["state"]:
            jobs = jobs.filter(state=form.cleaned_data["state"])
        if form.cleaned_data["type"]:
            jobs = jobs.filter(job_type=form.cleaned_data["type"])
        if form.cleaned_data["mine"]:
            jobs = jobs.filter(submitted_by_id=request.user.pk)
    return form, jobs


def _page(request: HttpRequest, jobs: Any) -> Any:
    return Paginator(jobs, PAGE_SIZE).get_page(request.GET.get("page"))


@login_required
@require_GET
def job_list(request: HttpRequest) -> HttpResponse:
    form, jobs = _filtered_jobs(request)
    context = {"filter_form": form, "page": _page(request, jobs), "poll_seconds": POLL_SECONDS}
    return render(request, "portal/jobs/list.html", context)


@login_required
@require_GET
def job_rows(request: HttpRequest) -> HttpResponse:
    """The table body of the list, polled by HTMX with the same filters and page."""
    _, jobs = _filtered_jobs(request)
    return render(request, "portal/jobs/_rows.html", {"page": _page(request, jobs)})


def _priority_defaults(projects: list[Any]) -> dict[str, dict[str, str]]:
    """project id -> job type -> the class the team's default gives (for the form's hint)."""
    tenants = list({p.tenant_id: p.tenant for p in projects}.values())
    by_tenant = selectors.priority_defaults_by_tenant(tenants)
    return {str(p.pk): by_tenant[p.tenant_id] for p in projects}


@login_required
@require_http_methods(["GET", "POST"])
def job_new(request: HttpRequest) -> HttpResponse:
    if request.method == "POST" and request.POST.get("project"):
        # A foreign id is a 404, also to a user who may submit nowhere.
        access.access_project(request.user, request.POST["project"])
    projects = _submittable_projects(request.user)
    if not projects:
        raise PermissionDenied("You are not a member of any team that can submit jobs.")
    form = JobSubmitForm(request.POST or None, projects=projects)
    quote = None
    if request.method == "GET":
        form.apply_type_defaults(request.GET.get("type", JobType.TRAINING))
    elif form.is_valid():
        project = access.access_project(request.user, form.cleaned_data["project"], submit=True)
        try:
            if request.POST.get("action") == "quote":
                # The Quote button: the same checks as a submit, nothing created.
                payload = form.to_payload()
                quote = job_quote(user=request.user, project=project, payload=payload).as_json()
            else:
                job, created = job_submit(
                    user=request.user,
                    project=project,
                    payload=form.to_payload(),
                    idempotency_key=form.cleaned_data["idempotency_key"],
                )
                _announce(request, job, created)
                return redirect("portal:job-detail", pk=job.pk)
        except SpecError as exc:
            form.add_spec_errors(exc.detail)
        except ConflictError as exc:
            form.add_error(None, str(exc))
    else:
        # The spec's own checks on what the form could read: every error in one round.
        form.add_spec_errors(spec_errors(form.to_payload()))
    context = {
        "form": form,
        "type_defaults": TYPE_DEFAULTS,
        "priority_defaults": _priority_defaults(projects),
        "quote": quote,
    }
    # HTMX swaps only 2xx answers: the Quote button's errors come back in a 200.
    status = 400 if form.errors and not request.headers.get("HX-Request") else 200
    return render(request, "portal/jobs/new.html", context, status=status)


def _announce(request: HttpRequest, job: Any, created: bool) -> None:
    if not created:
        messages.info(request, f"This form was already submitted: job {job.name} (#{job.pk}).")
    elif job.state == "pending_approval":
        messages.warning(request, f"Job {job.name} is {job.reason or 'waiting for approval'}.")
    else:
        messages.success(request, f"Job {job.name} submitted and {job.state}.")


def _status_context(request: HttpRequest, job: Any) -> dict[str, Any]:
    """The job's reason and events as this viewer may read them: ids of jobs they may not
    see (a preemptor or victim of another team) are not shown. A queued job's position and
    expected start as the scheduler last stored them (only read here)."""
    events = list(job_event_list(job))
    reader = ReasonReader(request.user, ReasonReader.texts_of([job], events))
    shown = [(event, reader.text(event.message)) for event in events]
    queue = job_queue_position(request.user, job)
    return {
        "job": job,
        "reason": reader.text(job.reason),
        "events": shown,
        "queue": queue,
        "queue_note": job_queue_note(job) if queue is None else None,
        "starts_in": _starts_in(queue, timezone.now()) if queue is not None else "",
    }


def in_about(seconds: float) -> str:
    """ "in about 40 minutes": rounded to what an estimate can promise."""
    minutes = seconds / 60
    if minutes < 1.5:
        return "any moment now"
    if minutes < 90:
        return f"in about {round(minutes)} minutes"
    hours = minutes / 60
    if hours < 36:
        return f"in about {round(hours)} hours"
    return f"in about {round(hours / 24)} days"


def _starts_in(queue: QueuePosition, now: datetime) -> str:
    if queue.estimated_at is None:
        return "not estimated yet"
    if queue.eta_p50 is None:
        return "not within the next week"
    return in_about((queue.eta_p50 - now).total_seconds())


@login_required
@require_GET
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = access_job(request.user, pk)
    context = {
        **_status_context(request, job),
        "spec_json": json.dumps(job.spec, indent=2, sort_keys=True),
        "approval": pending_request_for_job(request.user, job),
        "can_cancel": can_cancel(request.user, job) and not job.is_final,
        "cancel_form": CancelForm(),
        "poll_seconds": POLL_SECONDS,
        # Whoever sees the job sees what it has cost (access_job above).
        "cost": job_cost_so_far(job, now=timezone.now()),
        "can_read_logs": may_read_job_logs(request.user, job),
    }
    if not context["can_read_logs"]:
        # Finance sees where the job runs, but not its logs (scheduler/jobs/selectors.py).
        context["pods"] = list(job_pod_list(job))
    context["utilization"] = job_utilization(job, timezone.now())
    context["utilization_figure"] = job_figure(context["utilization"])
    return render(request, "portal/jobs/detail.html", context)


@login_required
@require_GET
def job_status(request: HttpRequest, pk: int) -> HttpResponse:
    """State, reason and events of one job, polled by HTMX until the job is final."""
    job = access_job(request.user, pk)
    context = {**_status_context(request, job), "poll_seconds": POLL_SECONDS}
    return render(request, "portal/jobs/_status.html", context)


@login_required
@require_POST
def job_cancel_view(request: HttpRequest, pk: int) -> HttpResponse:
    job = access_job(request.user, pk)
    form = CancelForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    try:
        job_cancel(user=request.user, job=job, reason=reason)
    except ConflictError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Job {job.name} cancelled.")
    return redirect("portal:job-detail", pk=job.pk)
