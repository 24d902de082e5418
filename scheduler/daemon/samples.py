"""The daemon's utilization samples, for a backend that reads its devices itself (the
simulated cluster: `UtilizationSource`). On Kubernetes the node agents report them.

One reading of the backend and one insert per sampling interval (the daemon's clock), after
the cycle's binds: a sample never delays a placement. The insert is fenced like the daemon's
other writes: a leader that lost its lease writes no round beside its successor's.
"""

from __future__ import annotations

from datetime import datetime

from scheduler.backends.base import UtilizationSource
from scheduler.leader import Lease
from scheduler.models import GpuDevice
from scheduler.telemetry.samples import DeviceReading, samples_ingest


def sample_devices(backend: object, lease: Lease, at: datetime) -> int:
    """Store the backend's device readings, taken `at`. Returns the samples written (0 for a
    backend without readings). The loop calls it once per sampling interval."""
    if not isinstance(backend, UtilizationSource):
        return 0
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
        at=at,
        flavors={device_id: model for (device_id, model), _ in known},
        fence=lease.fence,
    )
