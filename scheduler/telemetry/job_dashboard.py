"""The job page's utilization: each of its devices over the job's life (issue 20, "Job").

The job roll-ups are per job, not per device, so each device's line comes from the device's
own roll-ups, kept to the windows its allocation held it: the allocation says which job held
the device when, so every point belongs to this job. A shared device's figures are the whole
device's (the GPU reports no per-process utilization here); its label gives the job's share.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from scheduler.models import AllocationDevice, Job, RollupPeriod, RollupScope, UtilizationRollup
from scheduler.telemetry.rollups import floor_to

STEPS: dict[str, timedelta] = {
    RollupPeriod.FIVE_MINUTES: timedelta(minutes=5),
    RollupPeriod.HOUR: timedelta(hours=1),
}
# Lines drawn (and rows tabled) for the first devices of a large gang: a chart of hundreds of
# lines reads as noise, and the page would carry every window of every device.
MAX_DEVICES = 32


@dataclass(frozen=True)
class JobPoint:
    start: datetime
    utilization_mean: float
    utilization_max: float
    utilization_p95: float
    memory_mib: float | None


@dataclass(frozen=True)
class DeviceSeries:
    """One device the job held: `label` is "node / GPU i", with the share when fractional."""

    node: str
    index: int
    share_milli: int
    points: list[JobPoint]

    @property
    def label(self) -> str:
        share = f" ({self.share_milli / 1000:g} GPU)" if self.share_milli < 1000 else ""
        return f"{self.node} / GPU {self.index}{share}"


@dataclass
class JobUtilization:
    period: str
    devices: list[DeviceSeries] = field(default_factory=list)
    devices_held: int = 0  # every device the job held; more than len(devices) when cut

    @property
    def empty(self) -> bool:
        return not self.devices


Held = dict[tuple[str, int, int, int], list[tuple[datetime, datetime]]]


def _holdings(job: Job, now: datetime) -> Held:
    """(node, index, share, device id) -> the [from, until) intervals the job held it."""
    held: Held = defaultdict(list)
    shares = AllocationDevice.objects.filter(allocation__job=job).values_list(
        "allocation__node__name",
        "device__index",
        "milli",
        "device_id",
        "allocation__started_at",
        "allocation__ended_at",
    )
    for node, index, milli, device_id, began, ended in shares.order_by(
        "device__node_id", "device__index"
    ):
        held[(node, index, milli, device_id)].append((began, ended or now))
    return held


def job_utilization(job: Job, now: datetime) -> JobUtilization:
    """The job's devices over its life, from the devices' roll-ups within the intervals its
    allocations held them: 5-minute windows for a job that ran up to a day, hourly beyond.
    Two queries (the shares, the roll-ups)."""
    began = job.started_at or job.created_at
    ended = job.finished_at or now
    period = RollupPeriod.FIVE_MINUTES if ended - began <= timedelta(days=1) else RollupPeriod.HOUR
    step = STEPS[period]
    held = _holdings(job, now)
    kept = list(held.items())[:MAX_DEVICES]
    util = JobUtilization(period=period, devices_held=len(held))
    if not kept:
        return util
    spans = [span for _, intervals in kept for span in intervals]
    rows = (
        UtilizationRollup.objects.filter(
            period=period,
            scope=RollupScope.DEVICE,
            key_id__in=[key[3] for key, _ in kept],
            start__gte=floor_to(min(since for since, _ in spans), step),
            start__lt=max(until for _, until in spans),
        )
        .values_list(
            "key_id",
            "start",
            "utilization_mean",
            "utilization_max",
            "utilization_p95",
            "memory_used_mean_mib",
        )
        .order_by("key_id", "start")
    )
    by_device: dict[int, list[JobPoint]] = defaultdict(list)
    for device_id, start, mean, peak, p95, memory in rows:
        by_device[device_id].append(JobPoint(start, mean, peak, p95, memory))
    for (node, index, milli, device_id), intervals in kept:
        # A window counts when it overlaps an interval the job held the device.
        points = [
            p
            for p in by_device[device_id]
            if any(p.start + step > since and p.start < until for since, until in intervals)
        ]
        if points:
            util.devices.append(DeviceSeries(node, index, milli, points))
    return util
