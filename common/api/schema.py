"""What the OpenAPI schema says beyond the serializers: the error answers of every operation.

drf-spectacular documents the success answers it can infer. Every operation can also answer
with the one error shape (`common.api.errors`): 400 for bad input (bodies and query values),
401/403 for who may not, 404 for what the caller may not see, 429 past a rate limit, and on
writes 409, 413 and 415.
This post-processing hook adds them, so that the schema and the server stay in step
(tests/api/test_schema_fuzz.py checks every answer against it).
"""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "detail": {"type": "string"},
        "errors": {
            "type": "object",
            "description": "Field -> messages (nested for nested fields).",
            "additionalProperties": True,
        },
    },
    "required": ["detail"],
}
ALWAYS = {
    "400": "Bad input: a body or query value that is not valid, with the field at fault.",
    "401": "No credentials, or credentials that are not valid.",
    "403": "Authenticated, but not allowed to do this.",
    "404": "Not found, or not visible to the caller.",
    "406": "The Accept header asks for a representation the server cannot give.",
    "429": "Too many requests: a rate limit is spent (common/api/throttles.py); the "
    "Retry-After header says in how many seconds to try again.",
}
# Sent with every 429 (DRF's throttling): seconds until the window lets a request through.
RETRY_AFTER = {
    "Retry-After": {
        "schema": {"type": "integer", "minimum": 0},
        "description": "Seconds to wait before trying again.",
    }
}
ON_WRITES = {
    "409": "Conflicts with the current state.",
    "413": "The body is too large.",
    "415": "The body's media type is not accepted.",
}
WRITES = {"post", "put", "patch", "delete"}


def add_error_responses(result: dict[str, Any], **_: Any) -> dict[str, Any]:
    """drf-spectacular POSTPROCESSING_HOOKS entry."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path in result.get("paths", {}).values():
        for method, operation in path.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            codes = {**ALWAYS, **(ON_WRITES if method in WRITES else {})}
            for code, description in codes.items():
                answer = operation["responses"].setdefault(
                    code, {"description": description, "content": error}
                )
                if code == "429":  # a view's own 429 (the login guard's) is the same answer
                    answer.setdefault("content", error)
                    answer.setdefault("headers", RETRY_AFTER)
    return result
