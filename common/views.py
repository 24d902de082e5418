"""Health checks of what every process needs: the database answers, the broker is reachable.
The whole /healthz, with the scheduler's state, is `scheduler.views.healthz`."""

from django.conf import settings
from django.db import connection


def database_status() -> str:
    """'ok', or the driver's error (kept from anonymous callers by the view)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # any driver error means not ready
        return f"down: {str(exc)[:200]}"
    return "ok"


def broker_status() -> str:
    """'ok', 'local' (the embedded filesystem broker) or the error of a Redis ping."""
    url = getattr(settings, "REDIS_URL", "")
    if not url:
        return "local"
    import redis

    # Closed at once: a client left to the garbage collector keeps its socket open until
    # then, one per health probe.
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        return f"unreachable: {str(exc)[:120]}"
    finally:
        client.close()
    return "ok"
