"""Our checks, registered with schemathesis (every engine run applies them): bench/fuzz/."""

from __future__ import annotations

import json
from typing import Any

from schemathesis import check as schemathesis_check


@schemathesis_check
def refused_without_credentials(ctx: Any, response: Any, case: Any) -> bool | None:
    """An operation whose schema asks for credentials answers a valid request without any
    with 401 or 403, never with data nor with a 400 that shows the request was read. An
    invalid one may also meet a 4xx from before authentication (a path that matches no
    route is 404), never a success. Registered with schemathesis, so every run applies it;
    a request that carries credentials is not its business."""
    from schemathesis.core.failures import Failure

    if response.request.headers.get("Authorization") or {} in _security(case):
        return None
    negative = case.meta is not None and case.meta.generation.mode.is_negative
    refused = response.status_code >= 400 if negative else response.status_code in (401, 403)
    if not refused:
        raise Failure(
            operation=case.operation.label,
            title="Answered without credentials",
            message=f"{response.status_code} to a request without credentials; expected 401 or 403",
        )
    return True


# What DRF and our serializers say when a request breaks a rule a schema states: a required
# field, null, blank, a type, a bound, a length, a choice, a format, an undeclared field. A
# 400 to a request the schema calls valid that says one of these is drift: the schema should
# have stated the rule. Any other 400 is a rule no schema states (an id that names nothing, a
# name taken, a guarantee below the children's, the state of things), and is the server's to
# make.
SCHEMA_RULES = (
    "This field is required",
    "may not be null",
    "may not be blank",
    "A valid integer is required",
    "A valid number is required",
    "Must be a valid boolean",
    "Ensure this value is",
    "Ensure this field has",
    "Ensure that there are no more than",
    "is not a valid choice",
    "Not a valid string",
    "Expected a list",
    "Expected a dictionary",
    "must be a string",
    "must be a whole number",
    "must be a number",
    "must be true or false",
    "unknown or read-only field",
    "expected a JSON object",
    "Enter a valid",
    "must not be empty",
)


@schemathesis_check
def valid_data_accepted(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis's `positive_data_acceptance` (turned off in `engine_config`, this runs it),
    except for a 400 in the error shape none of whose messages is about a rule a schema states
    (SCHEMA_RULES): a type, a bound, a format or a required field the server enforces and the
    schema leaves out still fails it."""
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    try:
        return positive_data_acceptance(ctx, response, case)
    except Exception:
        if response.status_code == 400 and _messages_outside_schema(response.content):
            return None
        raise


def _messages_outside_schema(content: bytes) -> bool:
    """Whether a 400's every message is about a rule no schema states (SCHEMA_RULES)."""
    try:
        body = json.loads(content)
    except ValueError:
        return False
    if not isinstance(body, dict) or "detail" not in body:
        return False  # not the error shape at all
    return not any(
        rule in message for _, message in _leaves(body.get("errors", {})) for rule in SCHEMA_RULES
    )


def _leaves(errors: Any, field: str = "") -> list[tuple[str, str]]:
    """(field, message) of every message in a nested error object (`changes.0.value`)."""
    if isinstance(errors, dict):
        return [pair for key, value in errors.items() for pair in _leaves(value, str(key))]
    if isinstance(errors, list):
        return [pair for value in errors for pair in _leaves(value, field)]
    return [(field, str(errors))]


def _security(case: Any) -> list[dict[str, Any]]:
    definition = case.operation.definition.raw
    # No `security` on the operation and none at the top level: anyone may call it.
    return definition.get("security", case.operation.schema.raw_schema.get("security", [{}]))
