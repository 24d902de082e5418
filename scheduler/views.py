"""/healthz: liveness and readiness of the web process, and how the scheduler is doing.

- 503 "down" when the database does not answer: nothing works without it.
- 200 "degraded" when the broker is down (the portal and API keep accepting jobs and the
  daemon keeps scheduling; only background work waits, docs/faults.md 8), when the scheduler
  daemon is failing its cycles, stale, or not running, or when the schema and this code
  cannot run together ("schema": "behind", not migrated yet, or "incompatible", a later
  release's contract step applied; "newer", a later release's expand, is fine:
  common/releases/schema.py, docs/upgrading.md): the web process itself is fine, so a probe must not
  restart it, but a person or an alert must see it.
- 200 "ok" otherwise.

Anonymous callers (load balancers, probes) get the states and the version only: a rolling
upgrade (docs/upgrading.md) checks through the load balancer which version each web process
serves, without credentials. Error texts (database, broker, the daemon's last error) and
times are for platform admins: they can name hosts, users and SQL.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from common.releases.schema import schema_status
from common.releases.version import gantry_version
from common.views import broker_status, database_status
from scheduler.jobs.selectors import scheduler_health
from tenants.access import grants_for


def _state(text: str) -> str:
    """The state word of a status text ("unreachable: ..." -> "unreachable")."""
    return text.split(":", 1)[0]


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    detailed = request.user.is_authenticated and grants_for(request.user).platform_admin
    database = database_status()
    if database != "ok":
        body: dict[str, Any] = {
            "status": "down",
            "version": gantry_version(),
            "database": _state(database),
        }
        if detailed:
            body["database_error"] = database
        return JsonResponse(body, status=503)
    broker = broker_status()
    scheduler = scheduler_health(timezone.now())
    schema = schema_status().state
    healthy = broker in {"ok", "local"} and scheduler.status == "ok" and schema in {"ok", "newer"}
    body = {
        "status": "ok" if healthy else "degraded",
        "version": gantry_version(),
        "database": "ok",
        "schema": schema,
        "broker": _state(broker),
        "scheduler": scheduler.status,
    }
    if detailed:
        body["broker_error"] = broker if _state(broker) == "unreachable" else ""
        body["scheduler_detail"] = {
            "holder": scheduler.holder,
            "epoch": scheduler.epoch,
            "last_cycle_at": scheduler.last_cycle_at,
            "failures": scheduler.failures,
            "failed_at": scheduler.failed_at,
            "error": scheduler.error,
        }
    return JsonResponse(body)
