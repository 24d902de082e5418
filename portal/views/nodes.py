"""The Nodes pages, for platform admins (everyone else gets a 404): the inventory, one node
with its devices and what runs there, and cordon, drain, uncordon and heal through the same
services as the node API (scheduler/nodes/services.py), audited there. On the simulated cluster, a
simulated failure and its recovery too (`POST /api/v1/nodes/{id}/fail/` and the opposite)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from common.errors import DomainError
from portal.decorators import login_required
from portal.node_forms import SIMULATED_ONLY, NodeActionForm, NodeFilterForm
from scheduler.clusters.selectors import cluster_names
from scheduler.models import Node
from scheduler.nodes import services
from scheduler.nodes.selectors import (
    XID_HISTORY_ROWS,
    access_node,
    node_detail_data,
    node_filter_choices,
    node_health,
    node_list_inventory,
    node_mig_layout,
    node_nvlink_domain,
)
from tenants import access

PAGE_SIZE = 50


def _require_platform_admin(user: Any) -> None:
    if not access.grants_for(user).platform_admin:
        raise Http404("Not found.")


def _filtered(request: HttpRequest) -> tuple[NodeFilterForm, Any]:
    pools, models = node_filter_choices()
    form = NodeFilterForm(request.GET or None, pools=pools, models=models, clusters=cluster_names())
    filters: dict[str, Any] = {}
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        schedulable = {"yes": False, "no": True}.get(data["schedulable"])
        filters = {"pool": data["pool"], "model": data["model"], "health": data["health"]}
        filters["cluster"] = data["cluster"]
        filters["cordoned"] = schedulable
    return form, node_list_inventory(**filters, xids_from=timezone.now() - timedelta(hours=24))


def _row(node: Node) -> Node:
    """The node with what the table shows beside its fields."""
    node.health = node_health(node, node.gpus_unhealthy)  # type: ignore[attr-defined]
    node.mig_layout = node_mig_layout(node)  # type: ignore[attr-defined]
    node.nvlink_domain = node_nvlink_domain(node)  # type: ignore[attr-defined]
    return node


@login_required
@require_GET
def node_list(request: HttpRequest) -> HttpResponse:
    _require_platform_admin(request.user)
    form, nodes = _filtered(request)
    page = Paginator(nodes, PAGE_SIZE).get_page(request.GET.get("page"))
    page.object_list = [_row(node) for node in page.object_list]
    invalid = form.is_bound and not form.is_valid()
    context = {"filter_form": form, "page": page, "invalid": invalid}
    return render(request, "portal/nodes/list.html", context, status=400 if invalid else 200)


def _simulated() -> bool:
    return bool(settings.GANTRY_CLUSTER_BACKEND == "simulated")


def _detail_context(node: Node) -> dict[str, Any]:
    detail = node_detail_data(node)
    return {
        "simulated": _simulated(),
        "node": node,
        "detail": detail,
        "mig_layout": node_mig_layout(node),
        "nvlink_domain": node_nvlink_domain(node),
        "xid_rows": XID_HISTORY_ROWS,
        "xid_days": settings.GANTRY_XID_RETENTION_DAYS,
    }


@login_required
@require_GET
def node_detail(request: HttpRequest, pk: int) -> HttpResponse:
    node = access_node(request.user, pk)
    context = {**_detail_context(node), "form": NodeActionForm()}
    return render(request, "portal/nodes/detail.html", context)


def _act(user: Any, node: Node, action: str, reason: str) -> str:
    """Apply `action` through the node services; the message to show on success."""
    if action == "cordon":
        services.node_cordon(user=user, node=node, reason=reason)
        return f"Node {node.name} cordoned: nothing new is placed there."
    if action == "drain":
        services.node_drain(user=user, node=node, reason=reason)
        return f"Node {node.name} draining: the scheduler stops its jobs on its next cycle."
    if action == "fail":
        services.node_set_failed(user=user, node=node, failed=True)
        return (
            f"Node {node.name} failed (simulated): its pods are lost and the scheduler "
            "requeues its jobs on its next cycle."
        )
    if action == "recover":
        services.node_set_failed(user=user, node=node, failed=False)
        return f"Node {node.name} recovered (simulated): it reports Ready again."
    if action == "uncordon":
        services.node_uncordon(user=user, node=node)
        return f"Node {node.name} uncordoned: it takes new jobs again."
    services.node_heal(user=user, node=node)
    return f"Node {node.name} healed: its GPUs are declared healthy again."


@login_required
@require_POST
def node_action(request: HttpRequest, pk: int) -> HttpResponse:
    node = access_node(request.user, pk)
    form = NodeActionForm(request.POST)
    if not form.is_valid():
        context = {**_detail_context(node), "form": form}
        return render(request, "portal/nodes/detail.html", context, status=400)
    data = form.cleaned_data
    if data["action"] in SIMULATED_ONLY and not _simulated():
        messages.error(request, "Node failures are simulated only on the simulated cluster.")
        return redirect("portal:node-detail", pk=node.pk)
    if data["action"] == "drain" and not data["confirm"]:
        context = {**_detail_context(node), "form": form}
        return render(request, "portal/nodes/confirm_drain.html", context)
    try:
        messages.success(request, _act(request.user, node, data["action"], data["reason"]))
    except (DomainError, ValidationError, PermissionDenied) as problem:
        messages.error(request, f"Could not {data['action']} node {node.name}: {_text(problem)}")
    return redirect("portal:node-detail", pk=node.pk)


def _text(problem: Exception) -> str:
    if isinstance(problem, ValidationError):
        return "; ".join(problem.messages)
    return str(problem)
