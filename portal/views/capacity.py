"""The capacity page: per pool, the demand history and forecast band, the saturation days,
the drivers, expansion options side by side (owning against renting), TCO, and the export.
The rules are the API's (capacity/access.py): platform admins and finance see every pool, a
tenant admin their subtrees' forecasts, anyone else a 403. Finance enters TCO inputs here.
Nothing is fitted at a page view: the plans are the latest refresh's (Celery beat)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from capacity import access, expansions, export, selectors, services
from capacity.api.serializers import ExpansionIn, ExportQueryIn, PlansQueryIn, TcoInputsIn
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
    fmt = query["format"]
    body = export.write_csv(plans) if fmt == "csv" else export.write_xlsx(plans)
    response = HttpResponse(body, content_type=export.CONTENT_TYPES[fmt])
    stamp = timezone.now().strftime("%Y%m%d")
    response["Content-Disposition"] = f'attachment; filename="capacity-{stamp}.{fmt}"'
    return response


@login_required
@require_POST
def capacity_tco(request: HttpRequest) -> HttpResponse:
    """Finance's (or a platform admin's) TCO inputs for one GPU model; a 404 for anyone else
    (the form is not theirs to find)."""
    if not access.sees_pools(request.user):
        raise Http404("Not found.")
    # A form posts text: the integers are read here, the decimals stay strings (the API's).
    data: dict[str, Any] = {k: v for k, v in request.POST.items() if k != "csrfmiddlewaretoken"}
    for name in ("flavor", "depreciation_months"):
        if str(data.get(name, "")).isdigit():
            data[name] = int(data[name])
    body = TcoInputsIn(data=data)
    if not body.is_valid():
        for field, errors in body.errors.items():
            messages.error(request, f"{field}: {' '.join(str(e) for e in errors)}")
        return redirect("portal:capacity")
    values = dict(body.validated_data)
    flavor = get_object_or_404(ResourceFlavor, pk=values.pop("flavor").pk)
    try:
        services.tco_inputs_set(user=request.user, flavor=flavor, values=values)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect("portal:capacity")
    messages.success(request, f"TCO inputs of {flavor.name} saved.")
    return redirect("portal:capacity")


@login_required
@require_POST
def capacity_expansion(request: HttpRequest) -> HttpResponse:
    """A platform admin's expansion what-if from the capacity page; its run's page follows.
    Finance: 403 (it reads what-ifs, starts none); anyone else: 404."""
    if not access.sees_pools(request.user):
        raise Http404("Not found.")
    access.require_platform_admin(request.user)
    body = ExpansionIn(data=_form(request.POST))
    if not body.is_valid():
        for field, errors in body.errors.items():
            messages.error(request, f"{field}: {' '.join(str(e) for e in errors)}")
        return redirect("portal:capacity")
    try:
        started = expansions.expansion_start(
            user=request.user, now=timezone.now(), **body.validated_data
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect("portal:capacity")
    except RateLimitedError as exc:
        messages.error(request, str(exc))
        return redirect("portal:capacity")
    return redirect("portal:whatif-detail", pk=started.run.pk)


def _form(post: Any) -> dict[str, Any]:
    """A form's text as the API's input: numbers read, empty fields left out."""
    data: dict[str, Any] = {}
    for key, value in post.items():
        if key == "csrfmiddlewaretoken" or value == "":
            continue
        data[key] = (
            int(value) if key in {"gpus", "window_days", "at_day"} and value.isdigit() else value
        )
    return data


@login_required
@require_POST
def capacity_target(request: HttpRequest) -> HttpResponse:
    """A platform admin sets a pool's target utilization. Finance: 403; anyone else: 404."""
    if not access.sees_pools(request.user):
        raise Http404("Not found.")
    access.require_platform_admin(request.user)
    flavor = ResourceFlavor.objects.filter(name=request.POST.get("flavor", "")).first()
    if flavor is None:
        messages.error(request, "flavor: choose a GPU model.")
        return redirect("portal:capacity")
    try:
        services.pool_target_set(
            user=request.user,
            flavor=flavor,
            target_utilization=request.POST.get("target_utilization", ""),
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect("portal:capacity")
    messages.success(request, f"{flavor.name} is full at its new target from the next page view.")
    return redirect("portal:capacity")


@login_required
@require_POST
def capacity_suggest(request: HttpRequest) -> HttpResponse:
    """Finance (or a platform admin) asks for a rate card that recovers a model's cost."""
    if not access.sees_pools(request.user):
        raise Http404("Not found.")
    flavor = ResourceFlavor.objects.filter(name=request.POST.get("flavor", "")).first()
    if flavor is None:
        messages.error(request, "flavor: choose a GPU model.")
        return redirect("portal:capacity")
    try:
        suggestion = services.rate_suggestion_create(
            user=request.user,
            flavor=flavor,
            target_utilization=request.POST.get("target_utilization", ""),
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect("portal:capacity")
    messages.success(request, f"Suggested {suggestion.gpu_hour} per GPU-hour for {flavor.name}.")
    return redirect("portal:capacity")


@login_required
@require_POST
def capacity_suggestion_decide(request: HttpRequest, pk: int) -> HttpResponse:
    """Reject a suggestion (a reason) or accept it (a rate card): finance and platform admins.
    Anyone else: 404."""
    if not access.sees_pools(request.user):
        raise Http404("Not found.")
    suggestion = get_object_or_404(selectors.rate_suggestion_list(), pk=pk)
    accept = request.POST.get("decision") == "accept"
    reason = request.POST.get("reason", "").strip()
    if not accept and not reason:
        messages.error(request, "reason: say why the suggestion is rejected.")
        return redirect("portal:capacity")
    try:
        services.rate_suggestion_decide(
            user=request.user, suggestion=suggestion, accept=accept, reason=reason
        )
    except (ValidationError, ConflictError) as exc:
        text = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
        messages.error(request, text)
        return redirect("portal:capacity")
    messages.success(request, "Accepted: a rate card was added." if accept else "Rejected.")
    return redirect("portal:capacity")
