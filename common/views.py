"""Liveness and readiness: the database must answer; a broker that is down is 'degraded'.

Degraded still answers 200: the portal and API keep accepting jobs and scheduling goes on
without the broker (FAULTS 8); only background work (emails, roll-ups) waits.
"""

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET


def broker_status() -> str:
    """'ok', 'local' (the embedded filesystem broker) or the error of a Redis ping."""
    url = getattr(settings, "REDIS_URL", "")
    if not url:
        return "local"
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        client.ping()
    except redis.RedisError as exc:
        return f"unreachable: {str(exc)[:120]}"
    return "ok"


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # any driver error means not ready
        return JsonResponse({"status": "down", "database": str(exc)[:200]}, status=503)
    broker = broker_status()
    status = "ok" if broker in {"ok", "local"} else "degraded"
    return JsonResponse({"status": status, "database": "ok", "broker": broker})
