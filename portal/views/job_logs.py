"""The job page's pods and logs panel: where the job runs and ran, and the last lines of one
replica's log, then new lines as HTMX polls with the cursor of the previous answer, until the
pod's log is complete or the job is final. Loaded after the page, so that a slow cluster
never holds the page up."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django import forms
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET
from rest_framework.exceptions import ValidationError

from portal.decorators import login_required
from scheduler.backends.base import BackendError
from scheduler.clusters.backends import log_source
from scheduler.jobs.pods import JobLog, job_log_read, job_pod_list
from scheduler.jobs.selectors import access_job_logs

LOG_POLL_SECONDS = 3
# Replicas offered by the picker; a larger gang's others are asked for by number.
PICKER_REPLICAS = 64


class LogQueryForm(forms.Form):
    replica = forms.IntegerField(required=False, min_value=0, max_value=100_000)
    since = forms.CharField(required=False, max_length=200)


def _read(job: Any, replica: int, since: str) -> tuple[JobLog | None, str]:
    """The log, or None and why the cluster could not be asked. Bad input (a replica the job
    has not, a cursor this log did not write) raises ValidationError."""
    try:
        log = job_log_read(
            job=job, source=log_source(), now=timezone.now(), replica=replica, cursor=since
        )
    except BackendError as exc:
        return None, f"The cluster could not be asked for the log: {exc}"
    return log, ""


def _bad(errors: Mapping[Any, Any]) -> HttpResponse:
    text = "; ".join(f"{field}: {' '.join(map(str, msgs))}" for field, msgs in errors.items())
    return HttpResponseBadRequest(text, content_type="text/plain")


@login_required
@require_GET
def job_logs(request: HttpRequest, pk: int) -> HttpResponse:
    """The panel (no `since`: the replica's last lines), or a poll's answer (with `since`):
    the lines after the cursor, appended to the panel, and the next poll. A 404 for whoever
    may not read the job's logs (`access_job_logs`)."""
    job = access_job_logs(request.user, pk)
    form = LogQueryForm(request.GET)
    if not form.is_valid():
        return _bad(dict(form.errors))
    replica = form.cleaned_data["replica"] or 0
    since = form.cleaned_data["since"] or ""
    try:
        log, error = _read(job, replica, since)
    except ValidationError as exc:
        return _bad(exc.detail if isinstance(exc.detail, dict) else {"log": exc.detail})
    context = {
        "job": job,
        "replica": replica,
        "replicas": range(min(job.replicas, PICKER_REPLICAS)),
        "log": log,
        "error": error,
        "cursor": log.cursor if log else since,
        "polling": not job.is_final and not (log and log.done),
        "poll_seconds": LOG_POLL_SECONDS,
    }
    if "since" in request.GET:
        return render(request, "portal/jobs/_logs_poll.html", context)
    context["pods"] = list(job_pod_list(job))
    return render(request, "portal/jobs/_logs.html", context)
