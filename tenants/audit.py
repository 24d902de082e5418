"""The audit log: who changed what, when, with the state before and after.

`audit_record` is called by services inside the transaction of the change, so an entry exists
if and only if the change committed. There is no update or delete service for entries.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction
from django.utils import timezone

from tenants.models import AuditEntry, Tenant

# Bookkeeping columns that change on every save and say nothing about the change itself.
SKIPPED_FIELDS = frozenset({"created_at", "updated_at"})
# Secrets that the audit log, read by every admin up the tree, must never hold.
SECRET_FIELDS = frozenset({"webhook_secret"})
LEFT_OUT = SKIPPED_FIELDS | SECRET_FIELDS


def audit_snapshot(obj: models.Model | None, fields: Iterable[str] | None = None) -> Any:
    """A JSON-safe dict of `obj`'s concrete fields (foreign keys as ids), or None.

    `fields` limits it to those names (attribute names, e.g. "tenant" reads `tenant_id`).
    """
    if obj is None:
        return None
    wanted = set(fields) if fields is not None else None
    data: dict[str, Any] = {}
    for field in obj._meta.concrete_fields:
        if field.name in LEFT_OUT or (wanted is not None and field.name not in wanted):
            continue
        value = field.value_from_object(obj)
        # Decimals as numbers, so a value reads the same before (from the database, Decimal)
        # and after (as assigned, often a float).
        data[field.name] = float(value) if isinstance(value, Decimal) else value
    return json.loads(json.dumps(data, cls=DjangoJSONEncoder))


def _target(target: models.Model | tuple[str, Any]) -> tuple[str, str]:
    if isinstance(target, tuple):
        kind, pk = target
        return str(kind), str(pk)
    return target._meta.label_lower, str(target.pk)


def audit_record(
    *,
    actor: Any,
    action: str,
    tenant: Tenant | None,
    target: models.Model | tuple[str, Any],
    before: Any,
    after: Any,
) -> AuditEntry:
    """Append one entry. Must run inside the transaction of the change it records.

    `actor` is the user who acted, or None for the system (expiry). `target` is the changed
    object or a (type, id) pair. `before`/`after` are JSON-safe (see `audit_snapshot`); None
    means "did not exist" (a creation has no before, a deletion no after).
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError(f"audit_record({action}) must run inside the change's transaction.")
    target_type, target_id = _target(target)
    is_user = actor is not None and getattr(actor, "is_authenticated", False)
    return AuditEntry.objects.create(
        at=timezone.now(),
        actor=actor if is_user else None,
        actor_name=actor.get_username() if is_user else "",
        action=action,
        tenant=tenant,
        target_type=target_type,
        target_id=target_id,
        before=json.loads(json.dumps(before, cls=DjangoJSONEncoder)),
        after=json.loads(json.dumps(after, cls=DjangoJSONEncoder)),
    )
