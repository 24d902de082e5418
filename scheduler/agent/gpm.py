"""SM activity through NVML's GPM (GPU Performance Monitoring: Hopper and newer).

GPM metrics are rates between two samples of a device's counters: each report takes a new
sample and reads the metric over the interval since the previous report's, which it keeps
(and frees when the next one replaces it, or at close). The first report has no interval and
reports no SM activity.

The metric is `NVML_GPM_METRIC_SM_UTIL`, "percentage of SMs that were busy": DCGM's
`DCGM_FI_PROF_SM_ACTIVE` (the share of cycles an SM has at least one warp assigned, averaged
over the SMs) is the same measure, and dcgm-exporter serves NVML's SM_UTIL under that name on
GPM devices. Not `NVML_GPM_METRIC_SM_OCCUPANCY` (warps resident against the most an SM can
hold), which is DCGM's `DCGM_FI_PROF_SM_OCCUPANCY`, a different series.

None where the bindings have no GPM (an older nvidia-ml-py), where the device does not support
it (before Hopper, or in some VMs), or where a GPM call fails; a device that answers
NVMLError_NotSupported is not asked again this session.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)


class GpmReader:
    """Per device index, whether GPM works there and the previous report's sample."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self._supported: dict[int, bool] = {}
        self._previous: dict[int, Any] = {}

    def sm_active_pct(self, index: int, handle: Any) -> float | None:
        """SM activity (%) of the device since the previous call for it, or None."""
        if not self._supports(index, handle):
            return None
        previous = self._previous.pop(index, None)
        sample = None
        try:
            sample = self.nvml.nvmlGpmSampleAlloc()
            self.nvml.nvmlGpmSampleGet(handle, sample)
            value = self._sm_util(previous, sample) if previous is not None else None
        except Exception as exc:  # NVMLError_NotSupported, GpuIsLost, ...: no reading now
            self._failed(index, exc)
            self._free(sample)
            return None
        finally:
            self._free(previous)
        self._previous[index] = sample
        return value

    def close(self) -> None:
        for sample in self._previous.values():
            self._free(sample)
        self._previous.clear()

    def _supports(self, index: int, handle: Any) -> bool:
        if index not in self._supported:
            try:
                support = self.nvml.nvmlGpmQueryDeviceSupport(handle)
                self._supported[index] = bool(support.isSupportedDevice)
            except Exception as exc:  # AttributeError: bindings without GPM; NotSupported
                logger.info("GPM unavailable on GPU %d: %s", index, exc)
                self._supported[index] = False
        return self._supported[index]

    def _sm_util(self, first: Any, second: Any) -> float | None:
        nvml = self.nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1, request.sample2 = first, second
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        nvml.nvmlGpmMetricsGet(request)
        metric = request.metrics[0]
        if metric.nvmlReturn != nvml.NVML_SUCCESS:
            return None
        return round(min(100.0, max(0.0, float(metric.value))), 1)

    def _failed(self, index: int, exc: Exception) -> None:
        not_supported = getattr(self.nvml, "NVMLError_NotSupported", None)
        if isinstance(not_supported, type) and isinstance(exc, not_supported):
            self._supported[index] = False  # it will not start working: stop asking
        logger.debug("GPM reading of GPU %d failed: %s", index, exc)

    def _free(self, sample: Any) -> None:
        if sample is None:
            return
        try:
            self.nvml.nvmlGpmSampleFree(sample)
        except Exception as exc:  # the driver went away: nothing left to free
            logger.debug("GPM sample not freed: %s", exc)
