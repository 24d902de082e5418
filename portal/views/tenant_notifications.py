"""A tenant's idle rule and notifications page: the rule in force for everyone who sees the
tenant; its admins set the rule and the webhook, see the webhook's health and send a test.

The services check rights again: a forged POST by a member is a 403, a foreign tenant a 404.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from portal.decorators import login_required
from portal.forms import IdleRuleForm, WebhookForm
from portal.views.tenants import _tenant_context
from tenants import access, idle_rules, outbox, services
from tenants.models import Tenant


def _page(
    request: HttpRequest,
    tenant: Tenant,
    idle_form: IdleRuleForm | None = None,
    webhook_form: WebhookForm | None = None,
    new_secret: str | None = None,
) -> HttpResponse:
    view = idle_rules.idle_rule_view(tenant)
    can_manage = access.can_manage_tenant(request.user, tenant)
    initial = view["own"] or {k: v for k, v in view["effective"].items() if k != "origin"}
    context: dict[str, Any] = _tenant_context(request, tenant, "notifications") | {
        "idle": view,
        "idle_form": idle_form or IdleRuleForm(initial=initial),
    }
    if can_manage:  # the webhook's URL and health are its admins' alone
        context |= {
            "health": outbox.webhook_health(tenant),
            "webhook_shown": outbox.redact_url(tenant.webhook_url),
            "webhook_form": webhook_form or WebhookForm(),
            # Shown in this answer alone (never redirected through the session or a cookie).
            "new_secret": new_secret,
        }
    bad = (idle_form is not None and idle_form.errors) or (
        webhook_form is not None and webhook_form.errors
    )
    return render(request, "portal/tenants/notifications.html", context, status=400 if bad else 200)


@login_required
@require_http_methods(["GET", "POST"])
def tenant_notifications(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the page. POST: set the tenant's own idle rule (admins)."""
    tenant = access.access_tenant(request.user, pk)
    if request.method == "GET":
        return _page(request, tenant)
    form = IdleRuleForm(request.POST)
    if not form.is_valid():
        return _page(request, tenant, idle_form=form)
    data = form.cleaned_data
    try:
        idle_rules.idle_rule_set(
            user=request.user,
            tenant=tenant,
            threshold_pct=data["threshold_pct"],
            duration_s=data["duration_minutes"] * 60,
            action=data["action"],
        )
    except ValidationError as exc:  # a team's own rule looser than the one above it
        form.add_error(None, exc)
        return _page(request, tenant, idle_form=form)
    messages.success(request, f"The idle rule of {tenant.slug} is saved.")
    return redirect("portal:tenant-notifications", pk=tenant.pk)


@login_required
@require_POST
def tenant_idle_rule_delete(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = access.access_tenant(request.user, pk)
    if idle_rules.idle_rule_delete(user=request.user, tenant=tenant):
        messages.success(request, f"{tenant.slug} follows the idle rule above it again.")
    return redirect("portal:tenant-notifications", pk=tenant.pk)


@login_required
@require_POST
def tenant_webhook(request: HttpRequest, pk: int) -> HttpResponse:
    """Set (or, empty, remove) the tenant's webhook."""
    tenant = access.access_tenant(request.user, pk)
    form = WebhookForm(request.POST)
    if form.is_valid():
        try:
            services.tenant_update(
                user=request.user, tenant=tenant, webhook_url=form.cleaned_data["webhook_url"]
            )
        except ValidationError as error:
            for message in error.message_dict.get("webhook_url", error.messages):
                form.add_error("webhook_url", message)
    if form.errors:
        tenant.refresh_from_db()
        return _page(request, tenant, webhook_form=form)
    if tenant.webhook_secret_new:  # a new webhook: its signing secret, this once
        return _page(request, tenant, new_secret=tenant.webhook_secret_new)
    messages.success(request, f"The webhook of {tenant.slug} is saved.")
    return redirect("portal:tenant-notifications", pk=tenant.pk)


@login_required
@require_POST
def tenant_webhook_secret(request: HttpRequest, pk: int) -> HttpResponse:
    """Rotate the webhook's signing secret and show the new one, this once."""
    tenant = access.access_tenant(request.user, pk)
    try:
        secret = services.webhook_secret_rotate(user=request.user, tenant=tenant)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("portal:tenant-notifications", pk=tenant.pk)
    return _page(request, tenant, new_secret=secret)


@login_required
@require_POST
def tenant_webhook_test(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = access.access_tenant(request.user, pk)
    try:
        services.webhook_test_send(user=request.user, tenant=tenant)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, "A test notification is on its way; its outcome shows below.")
    return redirect("portal:tenant-notifications", pk=tenant.pk)
