"""Reconcile's sweep of held objects (issue 37): a Job (or JobSet, RayJob, TrainJob) a user
created runs (unsuspended) only while its Gantry job is live.

`scheduler.daemon.workloads` suspends one when its job stops, from the job's allocations.
What it cannot see, this catches: a suspension that failed on the last reconcile that saw the
allocations, an admission whose answer was lost (the Job unsuspended, its job requeued), a
daemon that died between a job's requeue and its object's suspension. Run at a new daemon's
first reconcile, then every `HELD_JOBS_SWEEP_S` (one list of each such kind's held objects; a
kind whose CRD is not installed lists as none).

The deployed daemon reads them from watches (`scheduler.backends.kubernetes.held`: a cache per
kind, relisted every `HELD_RELIST_S`), not from a list at every sweep: in Kueue's scenario at a
tenth each sweep's list of up to 1,500 Jobs held the cycle about 2 s of every 10 on two loaded
cores (bench/results.md, "k8s_kueue"). A cache a moment behind is safe here: the sweep only
suspends an object whose job is not live now, which is never wrong; one the watch has not
shown unsuspended yet is found at the next sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from scheduler.backends.base import BackendError
from scheduler.backends.workloads import JOB, RESUMABLE, Resumable
from scheduler.daemon.cluster import Cluster
from scheduler.daemon.workloads import LIVE, suspend_workload
from scheduler.models import Job

log = logging.getLogger("gantry.daemon")
# How often (daemon clock, s) after the first: the objects whose jobs stop in Gantry are
# suspended by reconcile as they stop; this is the backstop, and its lists cost a call each.
HELD_JOBS_SWEEP_S = 10.0
# How often (daemon clock, s) a sweep reading from watches lists each kind again: the watches
# keep the caches between; a list catches a watch that broke without ending.
HELD_RELIST_S = 300.0


class HeldReads(Protocol):
    """Where the sweep reads the held objects: the backend's lists, or the watches' caches."""

    def list_held_jobs(self) -> list[dict[str, Any]]: ...

    def list_held_objects(self, group: str, version: str, plural: str) -> list[dict[str, Any]]: ...


@runtime_checkable
class HeldObjects(HeldReads, Protocol):
    """A backend that lists the objects Gantry's webhook held, and suspends one (Kubernetes)."""

    def suspend_workload(self, namespace: str, workload: str) -> None: ...


class WatchedReads(HeldReads, Protocol):
    def close(self) -> None: ...


@runtime_checkable
class HeldWatching(Protocol):
    """A backend whose held objects can be read from watches (Kubernetes:
    `scheduler.backends.kubernetes.held`), each kind listed again every `relist_s` of
    `clock`."""

    def watch_held(self, *, clock: Callable[[], float], relist_s: float) -> WatchedReads: ...


def suspend_strays(cluster: Cluster, held: HeldReads | None = None) -> int:
    """Suspend every held object of a kind Gantry resumes (a Job, JobSet, RayJob, TrainJob,
    PyTorchJob) that runs while its Gantry job is not live (queued, preempted, ended, or no
    job at all: nothing but Gantry resumes a held object), read from `held` (the watches'
    caches) or else listed. Returns how many; a read that fails is tried at the next sweep,
    a suspension that fails likewise."""
    backend = cluster.backend
    if not isinstance(backend, HeldObjects):
        return 0
    reads: HeldReads = backend if held is None else held
    resumed: dict[str, tuple[Resumable, dict[str, Any]]] = {}
    for kind in RESUMABLE.values():
        try:
            listed = (
                reads.list_held_jobs()
                if kind == JOB
                else reads.list_held_objects(kind.group, kind.version, kind.plural)
            )
        except BackendError as error:
            log.warning("listing held %s failed (tried at the next sweep): %s", kind.plural, error)
            continue
        for obj in listed:
            if kind.suspended(obj) is False:
                resumed[str(obj["metadata"]["uid"])] = (kind, obj["metadata"])
    if not resumed:
        return 0
    live = set(
        Job.objects.filter(spec__workload__uid__in=list(resumed), state__in=LIVE).values_list(
            "spec__workload__uid", flat=True
        )
    )
    strays = [found for uid, found in resumed.items() if uid not in live]
    for kind, meta in strays:
        namespace, name = meta["namespace"], meta["name"]
        log.warning(
            "%s %s/%s runs without a live Gantry job: suspending it", kind.kind, namespace, name
        )
        suspend_workload(cluster, namespace, f"{kind.plural}/{name}")
    return len(strays)
