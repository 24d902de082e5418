"""What-if pages: propose and start a replay, follow its progress, read the result; and the
quota request's "Replay the effect". The rules are the API's (whatif.runs): platform and
tenant admins start runs, finance reads them, anyone else gets a 404 on every page.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from common.errors import RateLimitedError
from portal.decorators import login_required
from portal.whatif_charts import wait_figure
from tenants import access
from tenants.models import ApprovalRequest, PriorityClass, ResourceFlavor
from tenants.selectors import approval_list_visible
from whatif import runs
from whatif.api.serializers import WhatIfIn
from whatif.models import WhatIf, WhatIfState
from whatif.present import results_for

RECENT = 50
POLL_SECONDS = 2
FORM_FIELDS = ("scope", "window_days", "tenant", "flavor", "guaranteed", "limit", "weight")


def with_whatifs(user: Any, requests: list[ApprovalRequest]) -> list[ApprovalRequest]:
    """Set `whatif` on each quota request: the run kept for it that the user may see (the
    latest but failed ones), or None; one query for the whole list, none for users who may
    not use what-ifs."""
    ids = [r.pk for r in requests if r.kind == "quota"]
    kept: dict[int, WhatIf] = {}
    if ids and runs.may_use_whatif(user):
        found = runs.whatif_list_visible(user).filter(approval_id__in=ids)
        for run in found.exclude(state=WhatIfState.FAILED).order_by("-created_at", "-id"):
            if run.approval_id is not None:
                kept.setdefault(run.approval_id, run)
    for request in requests:
        request.whatif = kept.get(request.pk)  # type: ignore[attr-defined]
    return requests


def _page(
    request: HttpRequest, form: dict[str, str], errors: dict[str, str], status: int = 200
) -> HttpResponse:
    user = request.user
    grants = access.grants_for(user)
    context = {
        "runs": list(runs.whatif_list_visible(user)[:RECENT]),
        "may_start": runs.may_start(user),
        "platform_admin": grants.platform_admin,
        "scopes": runs.scope_choices(user).order_by("path"),
        "tenants": [
            t for t in runs.scope_choices(user).order_by("path") if access.can_set_quota(user, t)
        ],
        "flavors": ResourceFlavor.objects.order_by("name"),
        "classes": PriorityClass.objects.order_by("-value"),
        "form": form,
        "errors": errors,
        "poll_seconds": POLL_SECONDS,
    }
    return render(request, "portal/whatifs/list.html", context, status=status)


@login_required
@require_GET
def whatif_list(request: HttpRequest) -> HttpResponse:
    runs.require_whatif_user(request.user)
    return _page(request, {"window_days": "14"}, {})


@login_required
@require_POST
def whatif_new(request: HttpRequest) -> HttpResponse:
    """Start a replay of the form's change; a bad form is a 400 page saying what was wrong."""
    form = {k: request.POST.get(k, "").strip() for k in (*FORM_FIELDS, "class_name", "class_value")}
    if form["scope"]:  # a tenant the user cannot see is a 404, as everywhere in the portal
        form["scope"] = str(access.access_tenant(request.user, form["scope"]).pk)
    runs.require_whatif_starter(request.user)
    body, errors = _body(form)
    if not errors:
        try:
            run = runs.whatif_start(user=request.user, now=timezone.now(), **body)
        except ValidationError as problem:
            errors = {k: " ".join(v) for k, v in problem.message_dict.items()}
        except RateLimitedError as refused:  # one at a time, and an allowance a day
            response = _page(request, form, {"not now": str(refused)}, status=429)
            response["Retry-After"] = str(refused.retry_after_s)
            return response
        else:
            return redirect("portal:whatif-detail", pk=run.pk)
    return _page(request, form, errors, status=400)


def _body(form: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The form as the API's body (GPUs as milli-GPUs), checked by the API's serializer."""
    changes: list[dict[str, Any]] = []
    if form["tenant"]:
        quota: dict[str, Any] = {
            "kind": "quota",
            "tenant": form["tenant"],
            "flavor": form["flavor"],
        }
        for field, key in (("guaranteed", "guaranteed_milli"), ("limit", "limit_milli")):
            if form[field]:
                quota[key] = _milli(form[field])
        if form["weight"]:
            quota["weight"] = _number(form["weight"])
        changes.append(quota)
    if form["class_name"]:
        changes.append(
            {
                "kind": "priority_class",
                "name": form["class_name"],
                "value": _number(form["class_value"]),
            }
        )
    data = {"window_days": _number(form["window_days"] or "14"), "changes": changes}
    if form["scope"]:
        data["scope"] = _number(form["scope"])
    checked = WhatIfIn(data=data)
    if not checked.is_valid():
        return {}, _flatten(checked.errors)
    valid = checked.validated_data
    return {
        "scope_id": valid.get("scope"),
        "window_days": valid["window_days"],
        "changes": valid["changes"],
    }, {}


def _flatten(errors: Any, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(errors, dict):
        for key, value in errors.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(errors, list) and errors and not isinstance(errors[0], str):
        for i, value in enumerate(errors):
            out.update(_flatten(value, f"{prefix}[{i}]"))
    else:
        out[prefix] = " ".join(str(e) for e in errors) if isinstance(errors, list) else str(errors)
    return out


def _milli(text: str) -> Any:
    try:
        return round(float(text) * 1000)
    except ValueError:
        return text  # the serializer says what is wrong with it


def _number(text: str) -> Any:
    try:
        return float(text) if "." in text else int(text)
    except ValueError:
        return text


@login_required
@require_GET
def whatif_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = runs.access_whatif(request.user, pk)
    results = results_for(request.user, run)
    context = {
        "run": run,
        "results": results,
        "figure": wait_figure(results) if results else None,
        "poll_seconds": POLL_SECONDS,
    }
    return render(request, "portal/whatifs/detail.html", context)


@login_required
@require_GET
def whatif_status(request: HttpRequest, pk: int) -> HttpResponse:
    """The run's progress, polled while it is queued or running; once it is over, an
    HX-Refresh brings the whole result page."""
    run = runs.access_whatif(request.user, pk)
    response = render(
        request, "portal/whatifs/_progress.html", {"run": run, "poll_seconds": POLL_SECONDS}
    )
    if run.state in (WhatIfState.DONE, WhatIfState.FAILED) and request.headers.get("HX-Request"):
        response["HX-Refresh"] = "true"
    return response


@login_required
@require_POST
def approval_whatif(request: HttpRequest, pk: int) -> HttpResponse:
    """Replay a quota request's change for one who may decide it (or show the run kept)."""
    runs.require_whatif_user(request.user)
    try:
        approval = approval_list_visible(request.user).get(pk=pk)
    except ApprovalRequest.DoesNotExist:
        raise Http404("Not found.") from None
    if not runs.may_replay_approval(request.user, approval):
        raise PermissionDenied("Only those who may decide this quota request replay it.")
    try:
        run = runs.whatif_for_approval(
            user=request.user, request=approval, window_days=14, now=timezone.now()
        )
    except RateLimitedError as refused:
        messages.error(request, str(refused))
        return redirect("portal:approvals")
    return redirect("portal:whatif-detail", pk=run.pk)
