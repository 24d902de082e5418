"""A JSON parser with bounded nesting, so deep documents are a 400, not a crash, and that
refuses an object with a key twice (`{"priority": 1, "priority": 9}`): json.loads keeps the
last, so what a reviewer or a proxy reads is not what the server would act on."""

import json
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 16


class DuplicateKeyError(ValueError):
    pass


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook: the object, or DuplicateKeyError naming the key."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise DuplicateKeyError(f"JSON object has the key {key[:64]!r} more than once.")
        data[key] = value
    return data


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, computed without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return deepest


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = stream.read(settings.GANTRY_MAX_BODY_BYTES + 1) if stream is not None else b""
        if len(raw) > settings.GANTRY_MAX_BODY_BYTES:
            raise ParseError(f"JSON body exceeds {settings.GANTRY_MAX_BODY_BYTES} bytes.")
        try:
            data = json.loads(raw.decode("utf-8") or "null", object_pairs_hook=unique_keys)
        except RecursionError as exc:
            raise ParseError(f"JSON nesting is deeper than {MAX_DEPTH} levels.") from exc
        except DuplicateKeyError as exc:
            raise ParseError(str(exc)) from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error: {exc}") from exc
        if json_depth(data) > MAX_DEPTH:
            raise ParseError(f"JSON nesting is deeper than {MAX_DEPTH} levels.")
        return data
