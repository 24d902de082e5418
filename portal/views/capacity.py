"""The capacity page: per pool, the demand history and forecast band, the saturation days,
the drivers, expansion options side by side (owning against renting), TCO, and the export.
The rules are the API's (capacity/access.py): platform admins and finance see every pool, a
tenant admin their subtrees' forecasts, anyone else a 403. Finance enters TCO inputs here.
The forms' writes are the API's: capacity/api/submissions.py checks the values and applies them;
a bad value is the page again (400) with the form as typed and the error beside its field.
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
from portal.capacity_forms import (
    ExpansionForm,
    PlanningForm,
    PoolTargetForm,
    RateSuggestionForm,
    TcoForm,
)
from portal.decorators import login_required
from tenants.models import ResourceFlavor

SUGGESTIONS = 10  # the latest rate suggestions on the page; the API lists them all
PLANNING_FORMS: tuple[type[PlanningForm], ...] = (
    ExpansionForm,
    TcoForm,
    RateSuggestionForm,
    PoolTargetForm,
)


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
    return _page(request)


def _page(request: HttpRequest, posted: PlanningForm | None = None) -> HttpResponse:
    """The page; with `posted`, a form that was refused, shown as typed with its errors (400)."""
    access.require_capacity_viewer(request.user)
    query = _query(request, PlansQueryIn)
    run = selectors.forecast_run_latest()
    plans = []
    if run is not None and query is not None:
        plans = capacity_plans(
            request.user, run=run, flavor=query.get("flavor"), extra_gpus=query.get("gpus")
        )
    context: dict[str, Any] = {
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
    for form_class in PLANNING_FORMS:
        context[f"{form_class.key}_form"] = form_class()
    if posted is not None:
        context[f"{posted.key}_form"] = posted
    status = 400 if query is None or posted is not None else 200
    return render(request, "portal/capacity/page.html", context, status=status)


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


def _form(post: Any) -> dict[str, Any]:
    """The rate suggestion decision's text as the API's body, empty fields left out."""
    return {k: v for k, v in post.items() if k != "csrfmiddlewaretoken" and v != ""}


def _submitted(request: HttpRequest, submit: Callable[[], Any], done: Callable[[Any], str]) -> Any:
    """Run a suggestion's decision (a form of one field in a table row, so its errors are
    messages); its result, with `done(result)` as the success message, or None with each
    field at fault as an error message (ConflictError and 429s too)."""
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


def _require_planning_inputs(request: HttpRequest) -> None:
    """A 404 for anyone but finance and platform admins: the forms are not theirs to find."""
    if not access.sees_pools(request.user):
        raise Http404("Not found.")


def _planner_form(request: HttpRequest) -> dict[str, Any]:
    _require_planning_inputs(request)
    return _form(request.POST)


def _planning_submit(
    request: HttpRequest,
    form: PlanningForm,
    gate: Callable[[Any], None],
    submit: Callable[[dict[str, Any]], Any],
) -> Any:
    """Run a planning form's submission with the form's values; its result, or None with the
    errors on the form. `gate(user)` comes before the form is read: a user the form is not
    for gets its 403 (PermissionDenied), never its errors."""
    _require_planning_inputs(request)
    gate(request.user)
    if not form.is_valid():
        return None
    try:
        return submit(form.api_data())
    except ValidationError as exc:
        form.add_api_errors(exc)
    except (ConflictError, RateLimitedError) as exc:
        form.add_error(None, str(exc))
    return None


def _planning_write(
    form_class: type[PlanningForm],
    gate: Callable[[Any], None],
    submit: Callable[..., Any],
    done: Callable[[Any], str],
) -> Callable[..., Any]:
    """A form of planning inputs: `submit(user=, data=)` (capacity/api/submissions.py) with the
    form's values, `done(result)` as the success message, and back to the page."""

    @login_required
    @require_POST
    def view(request: HttpRequest) -> HttpResponse:
        form = form_class(request.POST)
        result = _planning_submit(
            request, form, gate, lambda data: submit(user=request.user, data=data)
        )
        if result is None:
            return _page(request, form)
        messages.success(request, done(result))
        return redirect("portal:capacity")

    return view


# Finance's (or a platform admin's) TCO inputs for one GPU model.
capacity_tco = _planning_write(
    TcoForm,
    access.require_planner,
    submissions.tco_inputs_submit,
    lambda inputs: f"TCO inputs of {inputs.flavor.name} saved.",
)
# A platform admin sets a pool's target utilization (finance: 403).
capacity_target = _planning_write(
    PoolTargetForm,
    access.require_platform_admin,
    submissions.pool_target_submit,
    lambda target: f"{target.flavor.name} is full at its new target from the next page view.",
)
# Finance (or a platform admin) asks for a rate card that recovers a model's cost.
capacity_suggest = _planning_write(
    RateSuggestionForm,
    access.require_planner,
    submissions.rate_suggestion_submit,
    lambda g: f"Suggested {g.gpu_hour} per GPU-hour for {g.flavor.name}.",
)


@login_required
@require_POST
def capacity_expansion(request: HttpRequest) -> HttpResponse:
    """A platform admin's expansion what-if from the capacity page; its run's page follows.
    Finance: 403 (it reads what-ifs, starts none)."""
    form = ExpansionForm(request.POST)
    started = _planning_submit(
        request,
        form,
        access.require_platform_admin,
        lambda data: submissions.expansion_submit(user=request.user, data=data, now=timezone.now()),
    )
    if started is None:
        return _page(request, form)
    messages.success(request, f"What-if {started.run.pk} started.")
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
