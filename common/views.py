"""Liveness and readiness: the database must answer; the broker being down is 'degraded'."""

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # any driver error means not ready
        return JsonResponse({"status": "down", "database": str(exc)[:200]}, status=503)
    return JsonResponse({"status": "ok", "database": "ok"})
