"""NVML readings as plain dataclasses, degrading to "no GPUs" without a driver.

Each field is read on its own: a consumer GPU without ECC, or a driver without utilization
counters, reports None for that field instead of losing the whole device. XID errors arrive
through an NVML event set registered once per session, so a report carries the XIDs seen since
the previous one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from scheduler.agent.gpm import GpmReader
from scheduler.agent.xids import FATAL_XIDS

logger = logging.getLogger(__name__)

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuReading:
    index: int
    uuid: str
    name: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    utilization_pct: int | None
    temperature_c: int | None
    ecc_uncorrected: int | None
    xid_errors: tuple[int, ...]
    lost: bool = False  # NVML could not open the device (e.g. fallen off the bus)
    power_w: float | None = None
    sm_active_pct: float | None = None  # NVML GPM (Hopper and newer): scheduler/agent/gpm.py

    @property
    def healthy(self) -> bool:
        if self.lost or self.ecc_uncorrected:
            return False
        return not FATAL_XIDS.intersection(self.xid_errors)


@dataclass(frozen=True)
class NodeReading:
    driver_version: str
    gpus: tuple[GpuReading, ...]
    error: str = ""  # why NVML could not be read ("" when it was)


def load_pynvml() -> ModuleType:
    import pynvml

    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSession:
    """NVML initialised once; `read()` per report; `close()` at exit.

    Without the library or a driver, `available` is False and `read()` returns no GPUs with
    the reason; the caller logs it once.
    """

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self.error = ""
        self._events: Any = None
        self._gpm: GpmReader | None = None
        self.nvml: ModuleType | None = None
        try:
            module = nvml or load_pynvml()
            module.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, OSError, ...
            self.error = f"{type(exc).__name__}: {exc}"
            return
        self.nvml = module
        self._events = self._register_xid_events()
        self._gpm = GpmReader(module)

    @property
    def available(self) -> bool:
        return self.nvml is not None

    def _register_xid_events(self) -> Any:
        nvml = self.nvml
        assert nvml is not None
        try:
            events = nvml.nvmlEventSetCreate()
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
        except Exception as exc:  # not supported (e.g. in some VMs): report without XIDs
            logger.info("XID events unavailable: %s", exc)
            return None
        return events

    def read(self) -> NodeReading:
        """One reading. A device NVML cannot open is reported lost (unhealthy), not skipped:
        the daemon must see that the node has a broken GPU, not a smaller node."""
        if self.nvml is None:
            return NodeReading(driver_version="", gpus=(), error=self.error)
        nvml = self.nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:  # the driver went away under us
            return NodeReading(driver_version="", gpus=(), error=f"{type(exc).__name__}: {exc}")
        xids = self._drain_xids(count)
        driver = self._field(lambda: _text(nvml.nvmlSystemGetDriverVersion())) or ""
        gpus = []
        for index in range(count):
            try:
                gpus.append(self._device(index, xids.get(index, ())))
            except Exception as exc:  # NVMLError_GpuIsLost and friends
                logger.warning("GPU %d unreadable: %s", index, exc)
                gpus.append(_lost(index))
        return NodeReading(driver_version=driver, gpus=tuple(gpus))

    def _device(self, index: int, xids: tuple[int, ...]) -> GpuReading:
        nvml = self.nvml
        assert nvml is not None
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = self._field(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        return GpuReading(
            index=index,
            uuid=self._field(lambda: _text(nvml.nvmlDeviceGetUUID(handle))) or "",
            name=self._field(lambda: _text(nvml.nvmlDeviceGetName(handle))) or "",
            memory_total_mib=int(memory.total // MIB) if memory else None,
            memory_used_mib=int(memory.used // MIB) if memory else None,
            utilization_pct=self._field(
                lambda: int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            ),
            temperature_c=self._field(
                lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            ),
            ecc_uncorrected=self._field(
                lambda: int(
                    nvml.nvmlDeviceGetTotalEccErrors(
                        handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                    )
                )
            ),
            xid_errors=xids,
            power_w=self._field(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
            sm_active_pct=self._gpm.sm_active_pct(index, handle) if self._gpm else None,
        )

    def _field(self, read: Any) -> Any:
        try:
            return read()
        except Exception as exc:  # NVMLError_NotSupported and friends: this field only
            logger.debug("NVML field unavailable: %s", exc)
            return None

    def _drain_xids(self, count: int) -> dict[int, tuple[int, ...]]:
        """XIDs seen since the last drain, by device index (never blocks)."""
        if self._events is None:
            return {}
        nvml = self.nvml
        assert nvml is not None
        by_uuid: dict[str, list[int]] = {}
        while True:
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # NVMLError_Timeout: nothing more pending
                break
            uuid = self._field(lambda event=event: _text(nvml.nvmlDeviceGetUUID(event.device)))
            by_uuid.setdefault(uuid or "", []).append(int(event.eventData))
        result: dict[int, tuple[int, ...]] = {}
        for index in range(count):
            uuid = self._field(
                lambda index=index: _text(
                    nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
                )
            )
            if uuid in by_uuid:
                result[index] = tuple(by_uuid[uuid])
        return result

    def close(self) -> None:
        nvml, events = self.nvml, self._events
        if nvml is None:
            return
        if events is not None:
            self._field(lambda: nvml.nvmlEventSetFree(events))
        if self._gpm is not None:
            self._gpm.close()
        self._field(nvml.nvmlShutdown)
        self.nvml = None


def _lost(index: int) -> GpuReading:
    return GpuReading(
        index=index,
        uuid="",
        name="",
        memory_total_mib=None,
        memory_used_mib=None,
        utilization_pct=None,
        temperature_c=None,
        ecc_uncorrected=None,
        xid_errors=(),
        lost=True,
    )
