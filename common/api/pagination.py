"""Page-number pagination that refuses absurd page sizes instead of silently clamping, and
says what is wrong with a page number: not a whole number from 1 is bad input (400), a
page past the last is not found (404) and names the last."""

from typing import Any

from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request

MAX_PAGE_SIZE = 200


class StrictPageNumberPagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return int(self.page_size or 50)
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_PAGE_SIZE:
            raise ValidationError(
                {"page_size": [f"must be an integer from 1 to {MAX_PAGE_SIZE}, got {raw[:20]!r}."]}
            )
        return int(raw)

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> Any:
        raw = request.query_params.get(self.page_query_param)
        last = self.last_page_strings
        if raw is not None and raw not in last and not (raw.isdigit() and int(raw) >= 1):
            raise ValidationError(
                {self.page_query_param: [f"must be a whole number from 1, got {raw[:20]!r}."]}
            )
        try:
            return super().paginate_queryset(queryset, request, view)
        except NotFound:
            size = self.get_page_size(request)
            pages = self.django_paginator_class(queryset, size).num_pages
            raise NotFound(f"Page {raw} is past the last page, {pages} ({size} a page).") from None

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        """The bounds the server enforces, in the schema too."""
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"].update(minimum=1, maximum=MAX_PAGE_SIZE)
            elif parameter["name"] == self.page_query_param:
                parameter["schema"].update(minimum=1)
        return parameters
