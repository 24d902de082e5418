"""Finance exports from the costs page: start one, follow its progress, download it.

The same query and rules as `/api/v1/cost-exports/` (billing.api.export_serializers,
billing.exports.runs): an export is its owner's alone (anyone else's id is a 404), a `tenant`
outside what the user sees is a 404, and the page's own gate applies: finance, platform admins
and tenant admins (others: 403).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from billing.api.export_serializers import ExportQueryIn
from billing.exports import runs as export_runs
from billing.exports.formats import CONTENT_TYPES
from billing.models import ExportFormat
from billing.periods import next_month
from billing.selectors import DIMENSIONS
from common.errors import RateLimitedError
from portal.decorators import login_required
from tenants import access

RECENT = 10
POLL_SECONDS = 2


def may_export(user: Any) -> bool:
    grants = access.grants_for(user)
    return grants.sees_everything or "admin" in grants.roles_by_path.values()


def recent_exports(user: Any) -> list[Any]:
    return list(export_runs.cost_export_list_visible(user)[:RECENT])


def section_context(user: Any, month_start: datetime | None) -> dict[str, Any]:
    """What the costs page's export section needs: the user's recent exports, the form's
    choices, and the page's month as its default window."""
    context: dict[str, Any] = {
        "exports": recent_exports(user),
        "poll_seconds": POLL_SECONDS,
        "export_formats": ExportFormat.choices,
        "export_dimensions": DIMENSIONS,
        "export_retention_h": f"{settings.GANTRY_EXPORT_RETENTION_H:g}",
        "export_form": {"format": "xlsx", "by": "team"},
    }
    if month_start is not None:
        context["export_form"].update(
            {"from": f"{month_start:%Y-%m-%d}", "to": f"{next_month(month_start):%Y-%m-%d}"}
        )
    return context


@login_required
@require_POST
def cost_export_new(request: HttpRequest) -> HttpResponse:
    """Start an export of the form's window, aggregation and format, then back to the costs
    page; a bad form is a 400 page with the form and what was wrong."""
    fields: dict[str, Any] = {
        k: v for k, v in request.POST.items() if k in {"format", "from", "to", "by"} and v
    }
    tenant_id = request.POST.get("tenant")
    if tenant_id:
        fields["tenant"] = access.access_tenant(request.user, tenant_id).pk
    if not may_export(request.user):
        raise PermissionDenied("Exports are for finance, platform admins and tenant admins.")
    query = ExportQueryIn(data=fields)
    if not query.is_valid():
        errors = {
            name: " ".join(str(m) for m in messages) for name, messages in query.errors.items()
        }
        return _form_again(request, fields, errors, status=400)
    data = dict(query.validated_data)
    fmt = data.pop("format")
    try:
        export_runs.cost_export_start(user=request.user, fmt=fmt, query=data, now=timezone.now())
    except RateLimitedError as refused:  # one at a time, and an allowance a day
        response = _form_again(request, fields, {"not now": str(refused)}, status=429)
        response["Retry-After"] = str(refused.retry_after_s)
        return response
    url = reverse("portal:costs")
    if "tenant" in fields:
        url += f"?tenant={fields['tenant']}"
    return redirect(url + "#cost-exports")


def _form_again(
    request: HttpRequest, fields: dict[str, Any], errors: dict[str, str], *, status: int
) -> HttpResponse:
    context = {
        **section_context(request.user, None),
        "export_form": {"format": "xlsx", "by": "team", **fields},
        "export_errors": errors,
        "top_id": fields.get("tenant"),
    }
    return render(request, "portal/costs/export_form.html", context, status=status)


@login_required
@require_GET
def cost_export_status(request: HttpRequest, pk: int) -> HttpResponse:
    """One export's row: polled while it runs, with the download link once written."""
    export = export_runs.access_cost_export(request.user, pk)
    return render(
        request,
        "portal/costs/_export_row.html",
        {"export": export, "poll_seconds": POLL_SECONDS, "now": timezone.now()},
    )


@login_required
@require_GET
def cost_export_download(request: HttpRequest, pk: int) -> FileResponse:
    export, path = export_runs.cost_export_file(request.user, pk, now=timezone.now())
    return FileResponse(
        path.open("rb"),
        as_attachment=True,
        filename=export.filename,
        content_type=CONTENT_TYPES[export.format],
    )
