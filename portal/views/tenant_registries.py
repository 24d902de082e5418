"""A tenant's allowed registries: the list in force for everyone who sees the tenant; admins
above it (as for quotas) set the tenant's own list.

The service checks rights again: a forged POST by the tenant's own admin is a 403, a foreign
tenant a 404.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from portal.decorators import login_required
from portal.forms import AllowedRegistriesForm
from portal.views.tenants import _tenant_context
from tenants import access, registries


@login_required
@require_http_methods(["GET", "POST"])
def tenant_registries(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the page. POST: set the tenant's own list (empty: follow the list above)."""
    tenant = access.access_tenant(request.user, pk)
    form = AllowedRegistriesForm(
        request.POST or None, initial={"entries": "\n".join(tenant.allowed_registries)}
    )
    if request.method == "POST" and form.is_valid():
        try:
            registries.allowed_registries_set(
                user=request.user, tenant=tenant, entries=form.cleaned_data["entries"]
            )
        except ValidationError as error:
            for message in error.message_dict.get("allowed_registries", error.messages):
                form.add_error("entries", message)
        else:
            messages.success(request, f"The registries of {tenant.slug} are saved.")
            return redirect("portal:tenant-registries", pk=tenant.pk)
    tenant.refresh_from_db()
    context = _tenant_context(request, tenant, "registries") | {
        "view": registries.registries_view(tenant),
        "form": form,
    }
    status = 400 if form.errors else 200
    return render(request, "portal/tenants/registries.html", context, status=status)
