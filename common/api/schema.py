"""What the OpenAPI schema says beyond the serializers: the error answers of every operation,
that request bodies take no undeclared field, and that no query value may be sent empty.

drf-spectacular documents the success answers it can infer. Every operation can also answer
with the one error shape (`common.api.errors`): 400 for bad input (bodies and query values),
401/403 for who may not, 404 for what the caller may not see, 429 past a rate limit, and on
writes 409, 413 and 415.
This post-processing hook adds them, so that the schema and the server stay in step
(tests/api/test_schema_fuzz.py checks every answer against it).

Every input serializer refuses a field it does not declare (`common.api.serializers`), so each
object a request body reaches is `additionalProperties: false`; every query value sent empty is
refused (`common.api.filters`, and the serializers' `allow_blank=False`), so each string query
parameter is `minLength: 1` (and a string in a body that may not be blank has a non-space,
as DRF trims before it checks), an integer one within 64 bits; an id in a path is routed only
in canonical decimal (`common.api.routers`), so it is bounded as routed.
"""

from __future__ import annotations

from typing import Any

from common.api.routers import MAX_ID

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
    close_request_bodies(result)
    refuse_empty_query_values(result)
    bound_path_ids(result)
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


def _operations(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        operation
        for path in result.get("paths", {}).values()
        for operation in path.values()
        if isinstance(operation, dict) and "responses" in operation
    ]


def close_request_bodies(result: dict[str, Any]) -> None:
    """`additionalProperties: false` on every object schema a request body reaches (through
    `$ref`, properties and array items), the request components included; an object that
    says what its extra keys hold (a map such as `node_labels`) keeps that."""
    components = result.get("components", {}).get("schemas", {})
    seen: set[int] = set()
    stack = [
        media["schema"]
        for operation in _operations(result)
        for media in operation.get("requestBody", {}).get("content", {}).values()
        if "schema" in media
    ]
    while stack:
        schema = stack.pop()
        if not isinstance(schema, dict) or id(schema) in seen:
            continue
        seen.add(id(schema))
        if "$ref" in schema:
            stack.append(components.get(schema["$ref"].rsplit("/", 1)[-1]))
            continue
        if "properties" in schema:
            schema.setdefault("additionalProperties", False)
        if schema.get("type") == "string" and schema.get("minLength", 0) >= 1:
            # DRF trims a string before it checks it is not blank: " " is blank.
            schema.setdefault("pattern", r"\S")
        stack.extend(schema.get("properties", {}).values())
        stack.extend(schema.get(key) for key in ("items", "additionalProperties"))
        stack.extend(schema.get("allOf", []) + schema.get("oneOf", []) + schema.get("anyOf", []))


def refuse_empty_query_values(result: dict[str, Any]) -> None:
    for operation in _operations(result):
        for parameter in operation.get("parameters", []):
            if parameter.get("in") != "query":
                continue
            schema = parameter.get("schema", {})
            schema = schema.get("items", schema)
            if schema.get("type") == "string" and "enum" not in schema:
                schema.setdefault("minLength", 1)
            elif schema.get("type") == "integer" and "maximum" not in schema:
                # What a database column holds (common.api.filters.BoundedIntegerField).
                schema.setdefault("minimum", -(2**63))
                schema["maximum"] = 2**63 - 1


def bound_path_ids(result: dict[str, Any]) -> None:
    """An id in a path is what `common.api.routers.ID_PATTERN` routes: 1 to 10**18 - 1."""
    for path in result.get("paths", {}).values():
        for operation in path.values():
            if not isinstance(operation, dict):
                continue
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                if parameter.get("in") == "path" and schema.get("type") == "integer":
                    schema.update(minimum=1, maximum=MAX_ID)
