"""The report the node agent posts to `/api/v1/nodes/report/`, and the POST itself."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from scheduler.agent.nvml import NodeReading

REPORT_PATH = "/api/v1/nodes/report/"


MAX_XIDS = 64  # per device and report: an XID storm must not make the report unacceptable


def build_report(node: str, reading: NodeReading) -> dict[str, Any]:
    """The JSON the endpoint takes. A field NVML could not read is sent as 0 (the endpoint
    takes numbers only); `healthy` is computed from everything that was read."""
    return {
        "node": node,
        "driver_version": reading.driver_version,
        "gpus": [
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "name": gpu.name[:63],
                "memory_total_mib": gpu.memory_total_mib or 0,
                "memory_used_mib": gpu.memory_used_mib or 0,
                "utilization_pct": gpu.utilization_pct or 0,
                "temperature_c": gpu.temperature_c or 0,
                # Sent as null when unread (the endpoint takes null for these two).
                "power_w": gpu.power_w,
                "sm_active_pct": gpu.sm_active_pct,
                "ecc_uncorrected": gpu.ecc_uncorrected or 0,
                "xid_errors": list(dict.fromkeys(gpu.xid_errors))[:MAX_XIDS],
                "healthy": gpu.healthy,
            }
            for gpu in reading.gpus
        ],
    }


def report_url(base: str) -> str:
    """`https://gantry.example` -> `https://gantry.example/api/v1/nodes/report/`."""
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {base!r}")
    if parts.path.rstrip("/").endswith(REPORT_PATH.rstrip("/")):
        return base
    return base.rstrip("/") + REPORT_PATH


def post_report(
    url: str, token: str, report: dict[str, Any], timeout_s: float = 10.0, scheme: str = "Token"
) -> tuple[int, Any]:
    """POST the report; returns the HTTP status and the answer's JSON (None when there is
    none: an error status, or a body that is not JSON). The answer names the pods holding the
    node's devices (scheduler/agent/exporter.py). Raises OSError (URLError) when unreachable.
    `scheme`: "Token" for a token of `manage.py node_agent_token`, "Bearer" for the pod's
    service-account token (scheduler/nodes/agent_auth.py)."""
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked in report_url
        report_url(url),
        data=json.dumps(report).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"{scheme} {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            status, raw = int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None
