"""The cluster and tenant dashboards: charts over a time range with the same figures in tables.

The cluster's is for platform admins and finance (anyone else: 404, as a page that does not
exist for them); a tenant's for whoever sees the tenant (`access_tenant`: its members and
admins, those of the tenants above it, finance and platform admins; others 404). The data
comes from scheduler/telemetry/dashboards.py, which bench/dashboards.py times.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from portal.dashboard_charts import cluster_figures, tenant_figures
from portal.decorators import login_required
from scheduler.telemetry.dashboards import (
    DEFAULT_RANGE,
    RANGES,
    Window,
    cluster_dashboard,
    tenant_dashboard,
    window_for,
)
from tenants import access


def _window(request: HttpRequest) -> tuple[Window | None, dict[str, Any]]:
    """The range asked (`?range=`, default 24h) and the picker's context; None and an
    error for a name that is not a range."""
    key = request.GET.get("range") or DEFAULT_RANGE
    context: dict[str, Any] = {"ranges": list(RANGES), "range": key}
    try:
        return window_for(key, timezone.now()), context
    except ValueError as problem:
        context["range"] = DEFAULT_RANGE
        context["error"] = str(problem)
        return None, context


@login_required
@require_GET
def dashboard_cluster(request: HttpRequest) -> HttpResponse:
    if not access.grants_for(request.user).sees_everything:
        raise Http404("No such page.")
    window, context = _window(request)
    if window is None:
        return render(request, "portal/dashboards/cluster.html", context, status=400)
    dash = cluster_dashboard(window)
    context.update(dash=dash, figures=cluster_figures(dash))
    return render(request, "portal/dashboards/cluster.html", context)


@login_required
@require_GET
def dashboard_tenant(request: HttpRequest, pk: int) -> HttpResponse:
    top = access.access_tenant(request.user, pk)
    window, context = _window(request)
    context["tenant"] = top
    if window is None:
        return render(request, "portal/dashboards/tenant.html", context, status=400)
    dash = tenant_dashboard(top, window)
    context.update(dash=dash, figures=tenant_figures(dash))
    return render(request, "portal/dashboards/tenant.html", context)
