"""The audit log: filter, page, export as CSV. Entries are read-only everywhere."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from datetime import datetime, time
from typing import Any

from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from common.text import csv_safe
from portal import selectors
from portal.decorators import login_required
from portal.forms import AuditFilterForm
from tenants import access
from tenants.models import AuditEntry
from tenants.selectors import audit_list_visible

PAGE_SIZE = 25  # as the other lists; ?page_size= takes 10 to 100
EXPORT_MAX_ROWS = 100_000
CSV_HEADER = ["at", "actor", "action", "tenant", "target_type", "target_id", "before", "after"]


def _require_audit_reader(user: Any) -> None:
    grants = access.grants_for(user)
    if not (grants.sees_everything or "admin" in grants.roles_by_path.values()):
        raise PermissionDenied("The audit log is for tenant admins, platform admins and finance.")


def _filtered(request: HttpRequest) -> tuple[AuditFilterForm, QuerySet[AuditEntry]]:
    """Entries the user may read, narrowed by the filters; a foreign tenant id is a 404."""
    tenant_id = request.GET.get("tenant")
    tenant = access.access_tenant(request.user, tenant_id) if tenant_id else None
    _require_audit_reader(request.user)
    tenants = list(access.tenants_visible(request.user).order_by("path"))
    form = AuditFilterForm(request.GET or None, tenants=tenants)
    rows = audit_list_visible(request.user).select_related("tenant")
    if tenant is not None:
        rows = rows.filter(tenant__path__startswith=tenant.path)
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        if data["action"]:
            rows = rows.filter(action__icontains=data["action"])
        if data["actor"]:
            rows = rows.filter(actor_name__iexact=data["actor"])
        if data["since"]:
            rows = rows.filter(
                at__gte=timezone.make_aware(datetime.combine(data["since"], time.min))
            )
        if data["until"]:
            rows = rows.filter(
                at__lte=timezone.make_aware(datetime.combine(data["until"], time.max))
            )
    return form, rows


@login_required
@require_GET
def audit_log(request: HttpRequest) -> HttpResponse:
    form, rows = _filtered(request)
    page = Paginator(rows, _page_size(form)).get_page(request.GET.get("page"))
    names = selectors.audit_reference_names(page.object_list)
    rows_with_changes = [
        (e, changes(e.before, e.after, names.get(e.pk, {}))) for e in page.object_list
    ]
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "filter_form": form,
        "page": page,
        "entries": rows_with_changes,
        "export_query": query.urlencode(),
    }
    return render(request, "portal/audit/list.html", context)


# Bookkeeping keys that say nothing a reader needs in the table (the CSV keeps everything).
HIDDEN_KEYS = frozenset({"id", "spec", "request_hash", "idempotency_key"})
MAX_VALUE = 60


def _page_size(form: AuditFilterForm) -> int:
    if form.is_bound and form.is_valid() and form.cleaned_data["page_size"]:
        return int(form.cleaned_data["page_size"])
    return PAGE_SIZE


def changes(
    before: Any, after: Any, names: dict[tuple[str, Any], str] | None = None
) -> list[tuple[str, str, str]]:
    """(key, before, after) for each key that differs, as short text; '' means absent.
    ``names`` reads a reference (key, id) as the name of what it refers to (a priority
    class's name, not its id)."""
    old = before if isinstance(before, dict) else {}
    new = after if isinstance(after, dict) else {}
    if not old and not new:
        return [("", _short(before), _short(after))] if before != after else []
    keys = [k for k in dict.fromkeys([*old, *new]) if k not in HIDDEN_KEYS]
    named = names or {}

    def shown(key: str, side: dict[str, Any]) -> str:
        if key not in side:
            return ""
        value = side[key]
        reference = named.get((key, value)) if isinstance(value, int | str) else None
        return reference or _short(value)

    return [
        (key, shown(key, old), shown(key, new))
        for key in keys
        if old.get(key) != new.get(key) or key not in old or key not in new
    ]


def _short(value: Any) -> str:
    if value is None:
        return "—"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv_rows(rows: QuerySet[AuditEntry]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_HEADER)
    for entry in rows[:EXPORT_MAX_ROWS].iterator(chunk_size=1000):
        yield writer.writerow(
            [
                entry.at.isoformat(),
                csv_safe(entry.actor_name or "system"),
                csv_safe(entry.action),
                csv_safe(entry.tenant.slug if entry.tenant else ""),
                csv_safe(entry.target_type),
                csv_safe(entry.target_id),
                csv_safe(_json(entry.before)),
                csv_safe(_json(entry.after)),
            ]
        )


def _json(value: Any) -> str:
    return "" if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False)


@login_required
@require_GET
def audit_export(request: HttpRequest) -> StreamingHttpResponse:
    _, rows = _filtered(request)
    response = StreamingHttpResponse(_csv_rows(rows), content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="gantry-audit-{stamp}.csv"'
    return response
