"""What an OPTIONS request answers: the view's name, description, renderers and parsers.

The fields each method takes are the OpenAPI schema's to describe (/api/v1/schema/), not
OPTIONS': DRF's default metadata described them by calling `get_object()` for PUT, which a
view without a queryset (the billing policies, keyed by organisation) cannot answer (a 500),
and which ran an object lookup, permission checks included, for a request that reads nothing.
"""

from __future__ import annotations

from typing import Any

from rest_framework.metadata import SimpleMetadata
from rest_framework.request import Request


class DescriptiveMetadata(SimpleMetadata):
    def determine_actions(self, request: Request, view: Any) -> dict[str, Any]:
        return {}  # no "actions" key: see the module's docstring
