"""Capacity planning's writes as submitted: the API's bodies and the page's forms, checked in one
place (the API's input serializers) and applied by capacity/services.py.

portal/views/capacity.py and capacity/api/views.py both call these with the user and the values
sent (JSON's types: the page turns its form's text into them first). Each checks who may do it
first (PermissionDenied), then the values with the API's input serializers, then calls the
service. Bad values raise one ValidationError naming every field at fault, and nothing is
written: the API answers it as a 400, the page shows it. Other tenants' objects never reach
here: the callers find them through the access rules (a 404).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from rest_framework import serializers

from capacity import access, expansions, services
from capacity.api import serializers as s
from capacity.models import PoolTarget, RateSuggestion, TcoInputs


def _checked(serializer: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    """`data` checked by `serializer` (a body that is not an object is refused there too)."""
    body = serializer(data=data)
    if not body.is_valid():
        raise ValidationError(
            {field: [str(e) for e in errors] for field, errors in body.errors.items()}
        )
    return dict(body.validated_data)


def pool_target_submit(*, user: Any, data: Any) -> PoolTarget:
    """`flavor` (a pk) and `target_utilization`: platform admins."""
    access.require_platform_admin(user)
    return services.pool_target_set(user=user, **_checked(s.PoolTargetIn, data))


def tco_inputs_submit(*, user: Any, data: Any) -> TcoInputs:
    """`flavor` (a pk) and every TCO figure: finance and platform admins."""
    access.require_planner(user)
    values = _checked(s.TcoInputsIn, data)
    flavor = values.pop("flavor")
    return services.tco_inputs_set(user=user, flavor=flavor, values=values)


def rate_suggestion_submit(*, user: Any, data: Any) -> RateSuggestion:
    """`flavor` (a pk) and `target_utilization`: finance and platform admins."""
    access.require_planner(user)
    return services.rate_suggestion_create(user=user, **_checked(s.RateSuggestionIn, data))


def rate_suggestion_decide_submit(
    *, user: Any, suggestion: RateSuggestion, accept: bool, data: Any
) -> RateSuggestion:
    """Accept (`valid_from`, optional) or reject (`reason`, required): finance and platform
    admins. ConflictError if it was decided already."""
    access.require_planner(user)
    values = _checked(s.AcceptIn if accept else s.RejectIn, data)
    return services.rate_suggestion_decide(
        user=user, suggestion=suggestion, accept=accept, **values
    )


def expansion_submit(*, user: Any, data: Any, now: datetime) -> expansions.Expansion:
    """An expansion what-if (`ExpansionIn`'s fields): platform admins."""
    access.require_platform_admin(user)
    return expansions.expansion_start(user=user, now=now, **_checked(s.ExpansionIn, data))
