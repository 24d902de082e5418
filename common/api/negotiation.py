"""Content negotiation as DRF's, strict about `?format=` like every other query parameter."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.settings import api_settings


class StrictContentNegotiation(DefaultContentNegotiation):
    """`?format=` sent empty is refused (400), where DRF reads it as no format at all: an
    empty parameter is a client's mistake, not a request for the default (common.api.filters)."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> Any:
        name = api_settings.URL_FORMAT_OVERRIDE
        if name and not format_suffix and "" in request.query_params.getlist(name):
            raise ValidationError({name: ["must not be empty; leave the parameter out instead."]})
        return super().select_renderer(request, renderers, format_suffix)
