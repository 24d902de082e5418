"""The daemon's utilization samples, for a backend that reads its devices itself (the
simulated cluster: `UtilizationSource`). On Kubernetes the node agents report them.

One reading of the backend and one insert per sampling interval (the daemon's clock), after
the cycle's binds: a sample never delays a placement. The insert is fenced like the daemon's
other writes: a leader that lost its lease writes no round beside its successor's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.backends.base import UtilizationSource
from scheduler.models import GpuDevice
from scheduler.utilization import DeviceReading, samples_ingest

if TYPE_CHECKING:
    from scheduler.daemon import Daemon


def sample_devices(daemon: Daemon) -> int:
    """Store the backend's device readings if a sampling interval passed since the last.
    Returns the samples written (0 when not due, or for a backend without readings)."""
    backend = daemon.backend
    if not isinstance(backend, UtilizationSource):
        return 0
    now = daemon.clock()
    if now - daemon.sampled_at < daemon.sample_every_s:
        return 0
    daemon.sampled_at = now
    readings = backend.device_readings()
    if not readings:
        return 0
    devices = {
        (node, index): (device_id, model)
        for device_id, node, index, model in GpuDevice.objects.values_list(
            "id", "node__name", "index", "model"
        )
    }
    known = [(devices[(r.node, r.index)], r) for r in readings if (r.node, r.index) in devices]
    return samples_ingest(
        [
            DeviceReading(
                device_id=device_id,
                utilization_pct=r.utilization_pct,
                memory_used_mib=r.memory_used_mib,
                power_w=r.power_w,
                temperature_c=r.temperature_c,
                sm_active_pct=r.sm_active_pct,
            )
            for (device_id, _), r in known
        ],
        at=daemon.now_dt(),
        flavors={device_id: model for (device_id, model), _ in known},
        fence=daemon.lease.fence,
    )
