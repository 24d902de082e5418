"""Free and fragmented GPUs per flavor, at scrape, in two queries.

Fragmented: free capacity on schedulable devices that not one replica of any queued job
could use where it lies. A free share is usable by a waiting job of the flavor when

- the job asks whole GPUs, k per replica: the device is wholly free and its node has at least
  k wholly free devices (the replica's devices are on one node);
- the job asks a share of one GPU (m milli-GPU): the device has at least m free.

Only the shape of a replica is compared: not CPU, memory, pools, taints, quota or the rest of
its gang. The figure is a floor (what is certainly stranded), computed from the smallest
whole and the smallest share asked per flavor. A flavor nobody waits for has no fragmented
GPUs: its free GPUs are idle, not stranded, and `gantry_gpus_free` shows them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily

from scheduler.core.units import MILLI_PER_GPU
from scheduler.models import GpuDevice, Job, JobState

WHOLE = MILLI_PER_GPU


@dataclass(frozen=True)
class Demand:
    """The smallest asks of the jobs waiting for one flavor (None: nobody asks that way)."""

    whole: int | None = None  # fewest whole GPUs per replica
    share: int | None = None  # smallest share of one GPU, milli

    def uses(self, free: int, whole_free_on_node: int) -> bool:
        if self.share is not None and free >= self.share:
            return True
        return free == WHOLE and self.whole is not None and whole_free_on_node >= self.whole


def demand_by_flavor(
    shapes: Iterable[tuple[int, list[str]]], flavors: Iterable[str]
) -> dict[str, Demand]:
    """`shapes`: (milli-GPU per replica, allowed flavors, [] for any) of the queued jobs."""
    known = set(flavors)
    whole: dict[str, int] = {}
    share: dict[str, int] = {}
    for milli, allowed in shapes:
        for flavor in set(allowed or known) & known:
            if milli >= WHOLE:
                whole[flavor] = min(whole.get(flavor, milli // WHOLE), milli // WHOLE)
            else:
                share[flavor] = min(share.get(flavor, milli), milli)
    return {f: Demand(whole.get(f), share.get(f)) for f in known if f in whole or f in share}


def fragmented_milli(
    free: Iterable[tuple[int, str, int]], demand: dict[str, Demand]
) -> tuple[dict[str, int], dict[str, int]]:
    """`free`: (node id, flavor, free milli) of schedulable devices with something free.
    Returns (free, fragmented) milli-GPU per flavor."""
    rows = list(free)
    whole_free: dict[int, int] = defaultdict(int)
    for node, _flavor, milli in rows:
        whole_free[node] += milli == WHOLE
    total: dict[str, int] = defaultdict(int)
    stranded: dict[str, int] = defaultdict(int)
    for node, flavor, milli in rows:
        total[flavor] += milli
        wanted = demand.get(flavor)
        if wanted is not None and not wanted.uses(milli, whole_free[node]):
            stranded[flavor] += milli
    return dict(total), dict(stranded)


def free_and_fragmented() -> tuple[dict[str, int], dict[str, int]]:
    """(free, fragmented) milli-GPU per flavor now, in two queries; read by the scrape and
    by the dashboards' queue snapshots."""
    devices = GpuDevice.objects.filter(
        healthy=True,
        allocated_milli__lt=WHOLE,
        node__present=True,
        node__ready=True,
        node__cordoned=False,
        node__cluster_unschedulable=False,
        node__drain_requested=False,
    ).values_list("node_id", "node__flavor", "allocated_milli")
    free_rows = [(node, flavor, WHOLE - used) for node, flavor, used in devices]
    shapes = (
        Job.objects.filter(state=JobState.QUEUED, gpu_milli_per_replica__gt=0)
        .values_list("gpu_milli_per_replica", "flavors")
        .distinct()
        .order_by()
    )
    flavors = {flavor for _, flavor, _ in free_rows}
    return fragmented_milli(free_rows, demand_by_flavor(shapes, flavors))


def fragmentation_families() -> Iterator[GaugeMetricFamily]:
    total, stranded = free_and_fragmented()
    flavors = set(total)
    free = GaugeMetricFamily(
        "gantry_gpus_free", "Free GPUs on schedulable, healthy devices.", labels=["flavor"]
    )
    fragmented = GaugeMetricFamily(
        "gantry_gpus_fragmented",
        "Free GPUs that no replica of any queued job could use where they are.",
        labels=["flavor"],
    )
    for flavor in sorted(flavors):
        free.add_metric([flavor], total.get(flavor, 0) / WHOLE)
        fragmented.add_metric([flavor], stranded.get(flavor, 0) / WHOLE)
    yield free
    yield fragmented
