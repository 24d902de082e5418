"""The scheduling profile in force, read-only, for platform admins."""

from __future__ import annotations

import yaml
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from portal.decorators import login_required
from scheduler.profiles.record import profile_record_get
from tenants import access
from tenants.models import AuditEntry

RECENT_CHANGES = 10


@require_GET
@login_required
def scheduler_profile(request: HttpRequest) -> HttpResponse:
    """What the leading daemon recorded: the profile, its file, when it was loaded, and a
    file content it refused. The audit log keeps every change."""
    if not access.grants_for(request.user).platform_admin:
        raise PermissionDenied("The scheduling profile is shown to platform admins.")
    record = profile_record_get()
    changes = AuditEntry.objects.filter(action="scheduler.profile").order_by("-at", "-pk")
    return render(
        request,
        "portal/scheduler/profile.html",
        {
            "record": record,
            "document": yaml.safe_dump(record.document, sort_keys=False) if record else "",
            "changes": list(changes[:RECENT_CHANGES]),
        },
    )
