"""The report the node agent posts to `/api/v1/nodes/report/`, and the POST itself."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from scheduler.agent.nvml import NodeReading

REPORT_PATH = "/api/v1/nodes/report/"


def build_report(node: str, reading: NodeReading) -> dict[str, Any]:
    return {
        "node": node,
        "driver_version": reading.driver_version,
        "gpus": [
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "name": gpu.name,
                "memory_total_mib": gpu.memory_total_mib,
                "memory_used_mib": gpu.memory_used_mib,
                "utilization_pct": gpu.utilization_pct,
                "temperature_c": gpu.temperature_c,
                "ecc_uncorrected": gpu.ecc_uncorrected,
                "xid_errors": list(gpu.xid_errors),
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


def post_report(url: str, token: str, report: dict[str, Any], timeout_s: float = 10.0) -> int:
    """POST the report; returns the HTTP status. Raises OSError (URLError) when unreachable."""
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked in report_url
        report_url(url),
        data=json.dumps(report).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Token {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
