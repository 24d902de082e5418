"""The Clusters page, for platform admins (everyone else gets a 404, as the Nodes pages):
each cluster's state, region and site, nodes (ready of listed), GPUs, use and when it last
answered, with a link to its nodes, and each cluster's GPUs allocated and used over a time
range (`?range=`, the dashboards' ranges: scheduler/telemetry/cluster_history.py); cordon
and uncordon through the cluster services
(scheduler/clusters/services.py), audited there. Adding a cluster is the API's and the CLI's
(`gantry clusters add`): it names credentials the daemon reads, an operator's task."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from common.errors import DomainError
from portal.dashboard_charts import cluster_history_figure
from portal.decorators import login_required
from scheduler.clusters import services
from scheduler.clusters.selectors import ClusterUse, cluster_use
from scheduler.models import Cluster
from scheduler.telemetry.cluster_history import utilization_by_cluster
from scheduler.telemetry.dashboards import DEFAULT_RANGE, RANGES, window_for
from tenants import access


def _require_platform_admin(user: Any) -> None:
    if not access.grants_for(user).platform_admin:
        raise Http404("Not found.")


@login_required
@require_GET
def cluster_list(request: HttpRequest) -> HttpResponse:
    _require_platform_admin(request.user)
    use = cluster_use()
    clusters = list(Cluster.objects.order_by("name"))
    rows = [(cluster, use.get(cluster.pk, ClusterUse())) for cluster in clusters]
    context: dict[str, Any] = {"rows": rows, "ranges": list(RANGES)}
    context["range"] = request.GET.get("range") or DEFAULT_RANGE
    try:
        window = window_for(context["range"], timezone.now())
    except ValueError as problem:
        context.update(range=DEFAULT_RANGE, error=str(problem))
        return render(request, "portal/clusters/list.html", context, status=400)
    history = utilization_by_cluster(window)
    context.update(window=window, history=history, figure=cluster_history_figure(history))
    return render(request, "portal/clusters/list.html", context)


@login_required
@require_POST
def cluster_action(request: HttpRequest, pk: int) -> HttpResponse:
    _require_platform_admin(request.user)
    cluster = get_object_or_404(Cluster, pk=pk)
    action = request.POST.get("action")
    if action not in ("cordon", "uncordon"):
        messages.error(request, f"Unknown action {str(action)[:30]!r}: cordon or uncordon.")
        return redirect("portal:clusters")
    try:
        services.cluster_set_cordoned(
            user=request.user, cluster=cluster, cordoned=action == "cordon"
        )
    except (DomainError, PermissionDenied) as error:
        messages.error(request, str(error))
    else:
        messages.success(request, f"Cluster {cluster.name}: {action}ed.")
    return redirect("portal:clusters")
