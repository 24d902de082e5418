"""One error shape for the API: {"detail": ..., "errors": {field: [messages]}}.

A database that cannot be reached for a moment (restarting, failing over) answers 503 with
Retry-After instead of a 500: nothing was written, and the same request (with its
Idempotency-Key) succeeds once the database is back.
"""

import logging
from typing import Any

import psycopg
from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve
from django.views.defaults import page_not_found
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from common.errors import ConflictError, DomainError, RateLimitedError

log = logging.getLogger("gantry.api")
# SQLSTATEs of a server going away or not yet accepting connections: 57P01 admin_shutdown,
# 57P02 crash_shutdown, 57P03 cannot_connect_now ("the database system is starting up");
# class 08 is every connection exception. None: the connection failed before any answer.
UNAVAILABLE_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
RETRY_AFTER_S = 5


def database_unavailable(exc: Exception) -> bool:
    """Whether `exc` says the PostgreSQL server is out of reach, not that a query was wrong
    (a lock or statement timeout, a bad query are errors of their own, left as they are)."""
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    cause = exc.__cause__
    if not isinstance(cause, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    state = cause.sqlstate
    return state is None or state.startswith("08") or state in UNAVAILABLE_SQLSTATES


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DjangoValidationError):
        errors = (
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
        # A model's full_clean files what no one field owns (a unique-together clash) under
        # NON_FIELD_ERRORS ("__all__"); the API names it as DRF does, one key for both.
        if NON_FIELD_ERRORS in errors:
            errors = {
                "non_field_errors" if key == NON_FIELD_ERRORS else key: value
                for key, value in errors.items()
            }
        exc = exceptions.ValidationError(errors)
    elif isinstance(exc, RateLimitedError):
        return Response(
            {"detail": str(exc)},
            status=status.HTTP_429_TOO_MANY_REQUESTS,
            headers={"Retry-After": str(exc.retry_after_s)},
        )
    elif isinstance(exc, ConflictError):
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    elif isinstance(exc, DomainError):
        return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
    elif database_unavailable(exc):
        log.warning("database unavailable, answered 503: %s", exc)
        return Response(
            {"detail": "The database is unavailable for a moment; retry shortly."},
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, exceptions.ValidationError):
        data = response.data
        if isinstance(data, dict):
            response.data = {"detail": "Invalid input.", "errors": data}
        else:
            response.data = {"detail": "Invalid input.", "errors": {"non_field_errors": data}}
    return response


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """`handler404`: a path under /api/ that matches no route (`/api/v1/jobs/abc/`) answers
    the API's error shape, as a route's own 404 does; the portal keeps its HTML page."""
    if request.path.startswith("/api/"):
        if not request.path.endswith("/") and _routed(f"{request.path_info}/"):
            # APPEND_SLASH never redirects here (this route takes the rest of /api/), and a
            # client does not repeat a POST's body after a redirect anyway: name the route.
            detail = f"Not found: API paths end with '/'; did you mean {request.path}/ ?"
            return JsonResponse({"detail": detail}, status=404)
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception or Http404())


def _routed(path: str) -> bool:
    try:
        return resolve(path).url_name != "api-not-found"
    except Resolver404:
        return False
