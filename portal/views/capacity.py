"""The capacity page: per pool, the demand history and forecast band, the saturation days,
the drivers, expansion options side by side (owning against renting), TCO, and the export.
The rules are the API's (capacity/access.py): platform admins and finance see every pool, a
tenant admin their subtrees' forecasts, anyone else a 403. Finance enters TCO inputs here.
The forms' writes are the API's: capacity/api/submissions.py checks the values and applies them.
Nothing is fitted at a page view: the plans are the latest refresh's (Celery beat)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from capacity import access, export, selectors
from capacity.api import submissions
from capacity.api.serializers import ExportQueryIn, PlansQueryIn
from capacity.present import capacity_plans
from common.errors import ConflictError, RateLimitedError
from portal.capacity_charts import forecast_figure
from portal.decorators import login_required
from tenants.models import ResourceFlavor

SUGGESTIONS = 10  # the latest rate suggestions on the page; the API lists them all


def _query(request: HttpRequest, serializer: type[PlansQueryIn]) -> dict[str, Any] | None:
    query = serializer(data={k: v for k, v in request.GET.items() if v != ""})
    return dict(query.validated_data) if query.is_valid() else None


def _view(plan: Any, index: int) -> dict[str, Any]:
    limit = plan.saturation.limit_gpu_hours_per_day if plan.saturation else None
    s = plan.series
    return {
        "plan": plan,
        "id": f"figure-capacity-{index}",
        "figure": forecast_figure(
            first_day=plan.first_day,
            last_day=plan.last_day,
            history={"requested": s.requested, "allocated": s.allocated, "used": s.used},
            band={"p10": s.p10, "p50": s.p50, "p90": s.p90, "baseline": s.baseline},
            limit=limit,
        ),
    }


@login_required
@require_GET
def capacity_page(request: HttpRequest) -> HttpResponse:
    access.require_capacity_viewer(request.user)
    query = _query(request, PlansQueryIn)
    run = selectors.forecast_run_latest()
    plans = []
    if run is not None and query is not None:
        plans = capacity_plans(
            request.user, run=run, flavor=query.get("flavor"), extra_gpus=query.get("gpus")
        )
    context = {
        "run": run,
        "views": [_view(plan, i) for i, plan in enumerate(plans)],
        "bad_query": query is None,
        "sees_pools": access.sees_pools(request.user),
        "planner": access.sees_pools(request.user),
        "platform_admin": access.is_platform_admin(request.user),
        "flavors": ResourceFlavor.objects.order_by("name"),
        "tco_inputs": list(selectors.tco_inputs_list()) if access.sees_pools(request.user) else [],
        "suggestions": list(selectors.rate_suggestion_list()[:SUGGESTIONS])
        if access.sees_pools(request.user)
        else [],
        "query": request.GET,
    }
    return render(
        request, "portal/capacity/page.html", context, status=400 if query is None else 200
    )


@login_required
@require_GET
def capacity_export(request: HttpRequest) -> HttpResponse:
    access.require_capacity_viewer(request.user)
    query = _query(request, ExportQueryIn)
    if query is None:
        return HttpResponse("Bad export query: format is csv or xlsx.", status=400)
    run = selectors.forecast_run_latest()
    plans = (
        []
        if run is None
        else capacity_plans(
            request.user, run=run, flavor=query.get("flavor"), extra_gpus=query.get("gpus")
        )
    )
    return export.attachment(plans, query["format"], now=timezone.now())


# The form fields that the API takes as JSON integers; every other field stays text.
INTEGER_FIELDS = frozenset({"flavor", "depreciation_months", "gpus", "window_days", "at_day"})


def _form(post: Any) -> dict[str, Any]:
    """A form's text as the API's body: integers read, empty fields left out (the checks,
    capacity/api/submissions.py's, say what is wrong with a value that is not one)."""
    data: dict[str, Any] = {}
    for key, value in post.items():
        if key == "csrfmiddlewaretoken" or value == "":
            continue
        data[key] = int(value) if key in INTEGER_FIELDS and value.isdigit() else value
    return data


def _submitted(request: HttpRequest, submit: Callable[[], Any], done: Callable[[Any], str]) -> Any:
    """Run a submission; its result, with `done(result)` as the success message, or None with
    each field at fault as an error message (ConflictError and 429s too)."""
    try:
        result = submit()
    except ValidationError as exc:
        if hasattr(exc, "error_dict"):
            for field, errors in exc.message_dict.items():
                messages.error(request, f"{field}: {' '.join(errors)}")
        else:
            messages.error(request, "; ".join(exc.messages))
        return None
    except (ConflictError, RateLimitedError) as exc:
        messages.error(request, str(exc))
        return None
    messages.success(request, done(result))
    return result


def _planner_form(request: HttpRequest) -> dict[str, Any]:
    """The posted form of a planning input; a 404 for anyone but finance and platform admins
    (the forms are not theirs to find)."""
    if not access.sees_pools(request.user):
        raise Http404("Not found.")
    return _form(request.POST)


def _planning_write(submit: Callable[..., Any], done: Callable[[Any], str]) -> Callable[..., Any]:
    """A form of planning inputs: `submit(user=, data=)` (capacity/api/submissions.py) with the
    form's values, `done(result)` as the success message, and back to the page."""

    @login_required
    @require_POST
    def view(request: HttpRequest) -> HttpResponse:
        data = _planner_form(request)
        _submitted(request, lambda: submit(user=request.user, data=data), done)
        return redirect("portal:capacity")

    return view


# Finance's (or a platform admin's) TCO inputs for one GPU model.
capacity_tco = _planning_write(
    submissions.tco_inputs_submit, lambda inputs: f"TCO inputs of {inputs.flavor.name} saved."
)
# A platform admin sets a pool's target utilization (finance: 403).
capacity_target = _planning_write(
    submissions.pool_target_submit,
    lambda target: f"{target.flavor.name} is full at its new target from the next page view.",
)
# Finance (or a platform admin) asks for a rate card that recovers a model's cost.
capacity_suggest = _planning_write(
    submissions.rate_suggestion_submit,
    lambda g: f"Suggested {g.gpu_hour} per GPU-hour for {g.flavor.name}.",
)


@login_required
@require_POST
def capacity_expansion(request: HttpRequest) -> HttpResponse:
    """A platform admin's expansion what-if from the capacity page; its run's page follows.
    Finance: 403 (it reads what-ifs, starts none)."""
    data = _planner_form(request)
    started = _submitted(
        request,
        lambda: submissions.expansion_submit(user=request.user, data=data, now=timezone.now()),
        lambda started: f"What-if {started.run.pk} started.",
    )
    if started is None:
        return redirect("portal:capacity")
    return redirect("portal:whatif-detail", pk=started.run.pk)


@login_required
@require_POST
def capacity_suggestion_decide(request: HttpRequest, pk: int) -> HttpResponse:
    """Reject a suggestion (a reason) or accept it (a rate card): finance and platform admins.
    Anyone else: 404."""
    data = _planner_form(request)
    suggestion = get_object_or_404(selectors.rate_suggestion_list(), pk=pk)
    accept = data.pop("decision", "") == "accept"
    body = {} if accept else {"reason": data.get("reason", "")}
    _submitted(
        request,
        lambda: submissions.rate_suggestion_decide_submit(
            user=request.user, suggestion=suggestion, accept=accept, data=body
        ),
        lambda _: "Accepted: a rate card was added." if accept else "Rejected.",
    )
    return redirect("portal:capacity")
