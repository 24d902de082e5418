"""The API's router: an object's id in a path is written in canonical decimal.

DRF's default lookup pattern takes any segment and the database reads it as it can, so
`/jobs/+1/` and `/jobs/01/` answered job 1: one object under many URLs, and what a proxy, a
cache or a log matches on is not what the server acts on. Ids here are positive integers of at
most 18 digits (below 2**63, so no database fails to bind one); any other segment matches no
route, a 404.
"""

from __future__ import annotations

from typing import Any

from rest_framework.routers import SimpleRouter

ID_PATTERN = r"[1-9][0-9]{0,17}"
MAX_ID = 10**18 - 1


class IdRouter(SimpleRouter):
    def get_lookup_regex(self, viewset: Any, lookup_prefix: str = "") -> str:
        lookup_field = getattr(viewset, "lookup_field", "pk")
        lookup_url_kwarg = getattr(viewset, "lookup_url_kwarg", None) or lookup_field
        value = getattr(viewset, "lookup_value_regex", ID_PATTERN)
        return f"(?P<{lookup_prefix}{lookup_url_kwarg}>{value})"
