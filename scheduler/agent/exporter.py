"""The node agent's own `/metrics`, under dcgm-exporter's names and labels.

The agent's report loop hands each reading to `DcgmExporter.update`, and the devices'
holders that Gantry answers the report with to `DcgmExporter.set_holders`; a scrape reads the
latest of both and touches neither NVML nor Gantry. Series (dcgm-exporter's units):

    DCGM_FI_DEV_GPU_UTIL     %          DCGM_FI_DEV_POWER_USAGE  W
    DCGM_FI_DEV_FB_USED      MiB        DCGM_FI_DEV_GPU_TEMP     C
    DCGM_FI_DEV_FB_FREE      MiB        DCGM_FI_DEV_XID_ERRORS   the last XID seen (0: none)
    DCGM_FI_PROF_SM_ACTIVE   ratio 0..1, only for devices whose NVML offers GPM

Labels: `gpu` (index), `UUID`, `device` (nvidiaN), `modelName`, `Hostname`, and `pod` and
`namespace` of the job holding the device ("" only for a device nobody holds). A value NVML
could not read is left out rather than reported as 0; a lost device has no series at all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from prometheus_client.registry import Collector

from scheduler.agent.nvml import GpuReading, NodeReading

LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "pod", "namespace"]


@dataclass(frozen=True)
class Holder:
    """The pod holding a device (the largest share where a device is shared)."""

    pod: str
    namespace: str


NOBODY = Holder("", "")


def _series() -> tuple[tuple[str, str, Callable[[GpuReading], float | None]], ...]:
    def free(gpu: GpuReading) -> float | None:
        if gpu.memory_total_mib is None or gpu.memory_used_mib is None:
            return None
        return max(0, gpu.memory_total_mib - gpu.memory_used_mib)

    def sm_active(gpu: GpuReading) -> float | None:
        return None if gpu.sm_active_pct is None else gpu.sm_active_pct / 100.0

    return (
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.utilization_pct),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: g.memory_used_mib),
        ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", free),
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.power_w),
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temperature_c),
        (
            "DCGM_FI_PROF_SM_ACTIVE",
            "Ratio of cycles an SM has a warp assigned.",
            sm_active,
        ),
    )


class DcgmExporter(Collector):
    """The latest reading and holders of this node's devices, as dcgm-exporter's series.
    Written by the report loop, read by the HTTP server's thread: a lock keeps the pair."""

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname
        self._lock = threading.Lock()
        self._gpus: tuple[GpuReading, ...] = ()
        self._holders: dict[int, Holder] = {}
        self._last_xid: dict[str, int] = {}  # by UUID: an index may change after a reset

    def update(self, reading: NodeReading) -> None:
        with self._lock:
            self._gpus = tuple(g for g in reading.gpus if not g.lost)
            for gpu in self._gpus:
                if gpu.xid_errors:
                    self._last_xid[gpu.uuid] = gpu.xid_errors[-1]

    def set_holders(self, holders: Mapping[int, Holder]) -> None:
        with self._lock:
            self._holders = dict(holders)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            gpus, holders, xids = self._gpus, dict(self._holders), dict(self._last_xid)
        labels = {g.index: self._labels(g, holders.get(g.index, NOBODY)) for g in gpus}
        for name, text, value in _series():
            family = GaugeMetricFamily(name, text, labels=LABELS)
            for gpu in gpus:
                reading = value(gpu)
                if reading is not None:
                    family.add_metric(labels[gpu.index], float(reading))
            yield family
        family = GaugeMetricFamily(
            "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", labels=LABELS
        )
        for gpu in gpus:
            family.add_metric(labels[gpu.index], float(xids.get(gpu.uuid, 0)))
        yield family

    def _labels(self, gpu: GpuReading, holder: Holder) -> list[str]:
        return [
            str(gpu.index),
            gpu.uuid,
            f"nvidia{gpu.index}",
            gpu.name,
            self.hostname,
            holder.pod,
            holder.namespace,
        ]


def holders_from(body: Any) -> dict[int, Holder]:
    """The `holders` of a report's answer ([{index, pod, namespace, milli}]): per device, the
    holder of the largest share (ties: the first pod by name). Anything malformed is skipped:
    a label is not worth failing a report for."""
    rows = body.get("holders") if isinstance(body, dict) else None
    found: list[tuple[int, int, str, str]] = []
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict):
            continue
        index, pod, namespace, milli = (row.get(k) for k in ("index", "pod", "namespace", "milli"))
        if isinstance(index, int) and isinstance(pod, str) and isinstance(namespace, str):
            found.append((index, -milli if isinstance(milli, int) else 0, pod, namespace))
    holders: dict[int, Holder] = {}
    for index, _share, pod, namespace in sorted(found):
        holders.setdefault(index, Holder(pod, namespace))
    return holders


def serve(exporter: DcgmExporter, port: int, addr: str = "0.0.0.0") -> WSGIServer:  # noqa: S104
    """Serve `/metrics` on a daemon thread (Prometheus scrapes each node's agent by pod IP).
    Returns the server: `server_address` holds the port (0 asks for any); `shutdown()`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
