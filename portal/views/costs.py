"""The finance page: charts of what was spent (by department per month, per flavor, idle
reserved capacity per tenant), cost per tenant for a month, and the two reconciliations of
issue 18.

Finance and platform admins see every organisation and the cluster's reconciliation; a
tenant admin sees their subtree (the cluster's capacity is not a tenant's data). Others: 403.
A `tenant` filter outside what the user sees is a 404.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from billing.budgets.burn_down import burn_downs
from billing.costs.charts import cost_charts, visible_month_lines
from billing.metering.schedule import metering_times
from billing.periods import next_month
from billing.selectors import tenant_costs
from billing.statements.reconciliation import cluster_reconciliation_kept
from billing.statements.rollup import SplitsMemo
from common.errors import DomainError
from portal.charts import drawn_burn_downs, figures
from portal.decorators import login_required
from portal.views.cost_exports import section_context
from tenants import access


def clock() -> datetime:
    """Now, read through this name so that tests can set it."""
    return datetime.now(UTC)


def _month(text: str | None) -> tuple[datetime | None, str | None]:
    """ "2031-01" -> its first instant (UTC); the current month when left out."""
    if not text:
        now = clock()
        return datetime(now.year, now.month, 1, tzinfo=UTC), None
    try:
        return datetime.strptime(text, "%Y-%m").replace(tzinfo=UTC), None
    except ValueError:
        return None, f"{text[:20]!r} is not a month (YYYY-MM)."


def _metering_if_current(start: datetime) -> Any:
    """When the next metering runs, for the month still being metered (an empty chart of
    it then says when costs appear); None for a month already past or still to come."""
    now = clock()
    return metering_times(now) if (start.year, start.month) == (now.year, now.month) else None


@login_required
@require_GET
def costs(request: HttpRequest) -> HttpResponse:
    user = request.user
    tenant_id = request.GET.get("tenant")
    top = access.access_tenant(user, tenant_id) if tenant_id else None
    grants = access.grants_for(user)
    if not access.may_see_costs(user):
        raise PermissionDenied("Costs are for finance, platform admins and tenant admins.")
    start, error = _month(request.GET.get("month"))
    context: dict[str, Any] = {
        "error": error,
        "top": top,
        "currency": settings.GANTRY_BILLING_CURRENCY,
        # Finance and platform admins keep the prices (portal.views.rate_cards).
        "rate_cards_link": grants.sees_everything,
    }
    status = 400 if error else 200
    if start is not None:
        end = next_month(start)
        context["month"] = f"{start:%Y-%m}"
        try:
            # Each month rated once: the last one feeds the table as well as the charts.
            # The cluster's hour splits of each month, read once for the lines and the
            # cluster's reconciliation.
            splits: SplitsMemo = {}
            month_lines = visible_month_lines(user, start, top, splits=splits)
            context["rows"], context["checks"] = tenant_costs(
                user, start, end, top, lines=month_lines[start]
            )
            context["charts"] = cost_charts(settings.GANTRY_BILLING_CURRENCY, month_lines)
            context["metering"] = _metering_if_current(start)
            context["figures"] = figures(context["charts"])
            context["burn_downs"] = drawn_burn_downs(burn_downs(user, start, top))
            if grants.sees_everything:
                context["cluster"] = cluster_reconciliation_kept(start, end, splits=splits)
        except DomainError as problem:
            context["error"], status = str(problem), 400
    context.update(section_context(user, start))
    return render(request, "portal/costs.html", context, status=status)
