"""The home page: one section per role the user holds, all on real data."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.text import capfirst
from django.views.decorators.http import require_GET

from billing.budgets.burn_down import burn_downs
from billing.costs.charts import cost_charts, visible_month_lines
from billing.metering.schedule import metering_times
from common.errors import DomainError
from portal import selectors
from portal.charts import drawn_burn_downs, figures
from portal.decorators import login_required
from portal.views.approvals import inbox_for
from scheduler.jobs.selectors import job_list_visible, queue_depth, scheduler_health
from scheduler.snapshot.quota_usage import quota_rows
from tenants import access
from tenants.models import TenantKind

# The home page's subtitle: what each section shows, in the order of the page.
SUBTITLE_PARTS = (
    ("member", "your jobs and your teams' GPU quota"),
    ("inbox", "requests waiting for you"),
    ("admin", "the tenants you administer"),
    ("finance", "GPU quota and use across the organisation"),
)


def _subtitle(context: dict[str, Any]) -> str:
    """The sections the page has (an inbox of None: the user decides nothing), as a sentence."""
    parts = [text for key, text in SUBTITLE_PARTS if context.get(key) is not None]
    return capfirst(f"{' · '.join(parts)}.") if parts else ""


def _member_section(user: Any) -> dict[str, Any]:
    teams = selectors.teams_of(user)
    return {
        "jobs": selectors.my_recent_jobs(user),
        "quotas": quota_rows(teams),
        "teams": teams,
        "several_teams": len(teams) > 1,
    }


def _admin_section(user: Any) -> dict[str, Any]:
    tenants = selectors.tenants_administered(user)
    ids = [t.pk for t in tenants]
    jobs = job_list_visible(user).filter(tenant_id__in=ids)
    return {
        "tenants": tenants,
        "quotas": quota_rows(tenants),
        "state_counts": selectors.job_state_counts(jobs),
    }


def _finance_section(user: Any, now: datetime) -> dict[str, Any]:
    """The costs page's charts for this month (and the months before), then quota and
    current use per department."""
    tenants = list(
        access.tenants_visible(user)
        .filter(kind__in=[TenantKind.ORGANISATION, TenantKind.DEPARTMENT])
        .order_by("path")
    )
    section: dict[str, Any] = {
        "quotas": quota_rows(tenants),
        "state_counts": selectors.job_state_counts(job_list_visible(user)),
    }
    try:
        charts = cost_charts(settings.GANTRY_BILLING_CURRENCY, visible_month_lines(user, now))
    except DomainError as problem:  # a flavor used without a rate card
        section["charts_error"] = f"Costs cannot be shown: {problem}"
    else:
        section["charts"], section["figures"] = charts, figures(charts)
        section["burn_downs"] = drawn_burn_downs(burn_downs(user, now))
        section["metering"] = metering_times(now)
    return section


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    user = request.user
    grants = access.grants_for(user)
    nav_roles = set(grants.roles_by_path.values())
    context: dict[str, Any] = {}
    if nav_roles:
        context["member"] = _member_section(user)
    if grants.platform_admin or "approver" in nav_roles or "admin" in nav_roles:
        context["inbox"] = inbox_for(user)
    if grants.platform_admin or "admin" in nav_roles:
        context["admin"] = _admin_section(user)
    if grants.finance:
        context["finance"] = _finance_section(user, timezone.now())
    if grants.platform_admin:
        now = timezone.now()
        context["scheduler"], context["queue"] = scheduler_health(now), queue_depth(now)
    context["subtitle"] = _subtitle(context)
    return render(request, "portal/home.html", context)
