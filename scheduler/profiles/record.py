"""What the leading daemon records of its scheduling profile, for platform admins.

One row (`SchedulingProfileRecord`): the profile in force, its file and when it was loaded,
and the last file content that was refused. Every change of the profile in force (another
document or another file, across restarts and leaders too) is audited as
`scheduler.profile`, with the settings before and after.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from scheduler.models import SchedulingProfileRecord
from scheduler.profiles.files import LoadedProfile
from tenants.audit import audit_record

TARGET = ("scheduler.schedulingprofile", 1)


def _audited(row: SchedulingProfileRecord | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {"path": row.path, "sha256": row.sha256, "document": row.document}


@transaction.atomic
def profile_record_loaded(*, loaded: LoadedProfile, holder: str) -> SchedulingProfileRecord:
    """Record the profile the daemon `holder` runs from now; audit it when it differs from
    the one recorded before. Clears a refusal: the file in force is a good one."""
    row = SchedulingProfileRecord.objects.select_for_update().filter(pk=1).first()
    before = _audited(row)
    row = row or SchedulingProfileRecord(pk=1)
    row.name = loaded.profile.name
    row.path = loaded.path or ""
    row.sha256 = loaded.sha256
    row.document = loaded.profile.to_document()
    row.loaded_at, row.loaded_by = timezone.now(), holder
    row.refused_sha256, row.refused_errors, row.refused_at = "", [], None
    row.save()
    after = _audited(row)
    if before is None or (before["path"], before["document"]) != (row.path, row.document):
        audit_record(
            actor=None,
            action="scheduler.profile",
            tenant=None,
            target=TARGET,
            before=before,
            after=after,
        )
    return row


def profile_record_refused(*, path: str, sha256: str, errors: list[tuple[str, str]]) -> None:
    """Record a profile file the daemon refused (it keeps the profile in force)."""
    SchedulingProfileRecord.objects.filter(pk=1).update(
        refused_sha256=sha256,
        refused_errors=[{"key": key, "message": message} for key, message in errors],
        refused_at=timezone.now(),
    )


def profile_record_get() -> SchedulingProfileRecord | None:
    return SchedulingProfileRecord.objects.filter(pk=1).first()
