"""Page-number pagination that refuses absurd page sizes instead of silently clamping."""

from typing import Any

from rest_framework.exceptions import ValidationError
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

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        """The bounds the server enforces, in the schema too."""
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"].update(minimum=1, maximum=MAX_PAGE_SIZE)
            elif parameter["name"] == self.page_query_param:
                parameter["schema"].update(minimum=1)
        return parameters
