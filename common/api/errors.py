"""One error shape for the API: {"detail": ..., "errors": {field: [messages]}}."""

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from common.errors import ConflictError, DomainError


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DjangoValidationError):
        errors = (
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
        exc = exceptions.ValidationError(errors)
    elif isinstance(exc, ConflictError):
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    elif isinstance(exc, DomainError):
        return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, exceptions.ValidationError):
        data = response.data
        if isinstance(data, dict):
            response.data = {"detail": "Invalid input.", "errors": data}
        else:
            response.data = {"detail": "Invalid input.", "errors": {"non_field_errors": data}}
    return response
