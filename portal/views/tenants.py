"""Tenant admin pages: overview, members and roles, quotas with use, priority defaults.

Anyone who sees a tenant may read these pages; the forms show only to those the services
would allow, and the services check again (a forged POST is a 403, a foreign tenant a 404).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from billing.budgets.forecast import tenant_cost_scope, tenant_spend_forecast
from common.errors import ConflictError
from portal import selectors
from portal.decorators import login_required
from portal.forms import MembershipForm, PolicyForm, PriorityDefaultForm, QuotaForm, RoleForm
from portal.templatetags.portal_tags import gpus
from scheduler.snapshot.quota_usage import quota_rows
from tenants import access, approvals, services
from tenants.approval_policies import policy_delete, policy_set
from tenants.approval_rules import policy_describe
from tenants.models import ApprovalPolicy, JobType, Tenant
from tenants.quotas.rules import QuotaValues
from tenants.selectors import (
    policy_list_visible,
    priority_default_list_visible,
    quota_list_visible,
)


def _tenant_context(request: HttpRequest, tenant: Tenant, tab: str) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "tab": tab,
        "ancestors": list(
            access.tenants_visible(request.user).filter(pk__in=tenant.ancestor_ids()[:-1])
        ),
        "can_manage": access.can_manage_tenant(request.user, tenant),
        "can_set_quota": access.can_set_quota(request.user, tenant),
    }


@login_required
@require_GET
def tenant_list(request: HttpRequest) -> HttpResponse:
    tenants = list(access.tenants_visible(request.user).order_by("path"))
    used = quota_rows(tenants)
    return render(request, "portal/tenants/list.html", {"tenants": tenants, "quotas": used})


@login_required
@require_GET
def tenant_detail(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = access.access_tenant(request.user, pk)
    children = list(access.tenants_visible(request.user).filter(parent=tenant))
    scope = tenant_cost_scope(request.user, tenant)
    context = _tenant_context(request, tenant, "overview") | {
        "children": children,
        "quotas": quota_rows([tenant, *children]),
        "projects": access.projects_visible(request.user).filter(tenant=tenant),
        "spend": tenant_spend_forecast(tenant) if scope is not None else None,
        "spend_scope": scope,
    }
    return render(request, "portal/tenants/detail.html", context)


# --- members -----------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def tenant_members(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = access.access_tenant(request.user, pk)
    form = MembershipForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        access.access_tenant(request.user, pk, manage=True)
        member = selectors.user_by_username(form.cleaned_data["username"])
        if member is None:
            form.add_error("username", "No user with this username.")
        else:
            services.membership_set(
                user=request.user, tenant=tenant, member=member, role=form.cleaned_data["role"]
            )
            messages.success(
                request,
                f"{member.get_username()} is now {form.cleaned_data['role']} of {tenant.slug}.",
            )
            return redirect("portal:tenant-members", pk=tenant.pk)
    members = selectors.membership_list_of(tenant)
    context = _tenant_context(request, tenant, "members") | {
        "form": form,
        "members": [(m, RoleForm(initial={"role": m.role})) for m in members],
    }
    return render(
        request, "portal/tenants/members.html", context, status=400 if form.errors else 200
    )


@login_required
@require_POST
def tenant_member_role(request: HttpRequest, pk: int, membership_pk: int) -> HttpResponse:
    tenant = access.access_tenant(request.user, pk)
    membership = selectors.access_membership(tenant, membership_pk)
    form = RoleForm(request.POST)
    if form.is_valid():
        services.membership_set(
            user=request.user, tenant=tenant, member=membership.user, role=form.cleaned_data["role"]
        )
        messages.success(
            request,
            f"{membership.user.get_username()} is now "
            f"{form.cleaned_data['role']} of {tenant.slug}.",
        )
    else:
        messages.error(request, "Choose a valid role.")
    return redirect("portal:tenant-members", pk=tenant.pk)


@login_required
@require_POST
def tenant_member_remove(request: HttpRequest, pk: int, membership_pk: int) -> HttpResponse:
    tenant = access.access_tenant(request.user, pk)
    membership = selectors.access_membership(tenant, membership_pk)
    services.membership_delete(user=request.user, membership=membership)
    messages.success(request, f"{membership.user.get_username()} removed from {tenant.slug}.")
    return redirect("portal:tenant-members", pk=tenant.pk)


# --- quotas ------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def tenant_quotas(request: HttpRequest, pk: int) -> HttpResponse:
    """Admins above the tenant set its quota; its own admins request a change instead."""
    tenant = access.access_tenant(request.user, pk)
    form = QuotaForm(request.POST or None, initial=_quota_initial(request, tenant))
    if request.method == "POST" and form.is_valid():
        done = _quota_save(request, tenant, form)
        if done:
            return redirect("portal:tenant-quotas", pk=tenant.pk)
    children = list(access.tenants_visible(request.user).filter(parent=tenant))
    context = _tenant_context(request, tenant, "quotas") | {
        "form": form,
        "quotas": quota_rows([tenant]),
        "child_quotas": quota_rows(children),
    }
    return render(
        request, "portal/tenants/quotas.html", context, status=400 if form.errors else 200
    )


def _quota_initial(request: HttpRequest, tenant: Tenant) -> dict[str, Any]:
    """The current values of ?flavor=NAME, so that "edit" starts from what is set."""
    name = request.GET.get("flavor")
    quota = (
        name
        and quota_list_visible(request.user)
        .filter(tenant=tenant, flavor__name=name, cluster__isnull=True)
        .first()
    )
    if not quota:
        return {}
    return {
        "flavor": quota.flavor.name,
        "guaranteed": gpus(quota.guaranteed_milli),
        "limit": gpus(quota.limit_milli),
        "lend_limit": gpus(quota.lend_limit_milli) if quota.lend_limit_milli is not None else None,
        "user_limit": gpus(quota.user_limit_milli) if quota.user_limit_milli is not None else None,
        "weight": quota.weight,
    }


def _optional_milli(request: HttpRequest, tenant: Tenant, form: QuotaForm, name: str) -> int | None:
    """An optional amount (`lend_limit`, `user_limit`) as posted (blank: none; 0 is a value),
    or the current one when the form sent no such field: saving the other values never
    clears it."""
    if name in form.data or form.cleaned_data.get("cluster") is not None:
        return form.milli(name)  # a pin has none of its own: whatever was typed, if anything
    flavor = form.cleaned_data["flavor"]
    current = (
        quota_list_visible(request.user)
        .filter(tenant=tenant, flavor=flavor, cluster__isnull=True)
        .first()
    )
    value: int | None = None if current is None else getattr(current, f"{name}_milli")
    return value


def _quota_save(request: HttpRequest, tenant: Tenant, form: QuotaForm) -> bool:
    flavor, cluster = form.cleaned_data["flavor"], form.cleaned_data.get("cluster")
    where = f"{flavor.name} on {cluster.name}" if cluster is not None else flavor.name
    values = QuotaValues(
        guaranteed_milli=form.milli("guaranteed") or 0,
        limit_milli=form.milli("limit") or 0,
        lend_limit_milli=_optional_milli(request, tenant, form, "lend_limit"),
        weight=float(form.cleaned_data["weight"]),
        user_limit_milli=_optional_milli(request, tenant, form, "user_limit"),
    )
    try:
        if access.can_set_quota(request.user, tenant):
            services.quota_set(
                user=request.user, tenant=tenant, flavor=flavor, values=values, cluster=cluster
            )
            messages.success(request, f"Quota of {tenant.slug} for {where} saved.")
        else:
            approvals.quota_request_create(
                user=request.user,
                tenant=tenant,
                flavor=flavor,
                values=values,
                justification=form.cleaned_data["justification"],
                cluster=cluster,
            )
            messages.success(
                request,
                f"Quota change for {where} requested; an admin above {tenant.slug} decides it.",
            )
    except ValidationError as exc:
        form.add_service_errors(
            exc.message_dict if hasattr(exc, "error_dict") else {"": exc.messages}
        )
        return False
    except ConflictError as exc:
        form.add_error(None, str(exc))
        return False
    return True


# --- priority defaults -------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def tenant_priorities(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = access.access_tenant(request.user, pk)
    form = PriorityDefaultForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        services.priority_default_set(
            user=request.user,
            tenant=tenant,
            job_type=form.cleaned_data["job_type"],
            priority_class=form.cleaned_data["priority_class"],
        )
        messages.success(
            request,
            f"Default priority of {form.cleaned_data['job_type']} jobs in {tenant.slug} saved.",
        )
        return redirect("portal:tenant-priorities", pk=tenant.pk)
    own = {
        row.job_type: row
        for row in priority_default_list_visible(request.user).filter(tenant=tenant)
    }
    rows = [
        (
            job_type,
            label,
            own.get(job_type),
            services.priority_default_for(tenant=tenant, job_type=job_type),
        )
        for job_type, label in JobType.choices
    ]
    context = _tenant_context(request, tenant, "priorities") | {"form": form, "rows": rows}
    return render(
        request, "portal/tenants/priorities.html", context, status=400 if form.errors else 200
    )


# --- approval policies -------------------------------------------------------------------


def _access_policy(request: HttpRequest, tenant: Tenant, policy_pk: int) -> ApprovalPolicy:
    try:
        return policy_list_visible(request.user).get(pk=policy_pk, tenant=tenant)
    except ApprovalPolicy.DoesNotExist:
        raise Http404("Not found.") from None


@login_required
@require_http_methods(["GET", "POST"])
def tenant_policies(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = access.access_tenant(request.user, pk)
    form = PolicyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            policy_set(
                user=request.user,
                tenant=tenant,
                rule=data["rule"],
                threshold=data["threshold"],
                priority_class=data["priority_class"],
                applies_to_jobs=data["applies_to_jobs"],
                applies_to_quota=data["applies_to_quota"],
                description=data["description"],
            )
        except ValidationError as exc:
            form.add_service_errors(
                exc.message_dict if hasattr(exc, "error_dict") else {"": exc.messages}
            )
        else:
            messages.success(request, f"Approval policy added to {tenant.slug}.")
            return redirect("portal:tenant-policies", pk=tenant.pk)
    visible = policy_list_visible(request.user)
    context = _tenant_context(request, tenant, "policies") | {
        "form": form,
        "policies": [(p, policy_describe(p)) for p in visible.filter(tenant=tenant)],
        "inherited": [
            (p, policy_describe(p))
            for p in visible.filter(tenant_id__in=tenant.ancestor_ids()[:-1]).order_by(
                "tenant__path"
            )
        ],
    }
    return render(
        request, "portal/tenants/policies.html", context, status=400 if form.errors else 200
    )


@login_required
@require_POST
def tenant_policy_delete(request: HttpRequest, pk: int, policy_pk: int) -> HttpResponse:
    tenant = access.access_tenant(request.user, pk)
    policy = _access_policy(request, tenant, policy_pk)
    policy_delete(user=request.user, policy=policy)
    messages.success(request, f"Approval policy removed from {tenant.slug}.")
    return redirect("portal:tenant-policies", pk=tenant.pk)
