"""Reconcile's sweep of held Jobs (issue 37): a Job a user created runs (unsuspended) only
while its Gantry job is live.

`scheduler.daemon.workloads` suspends a Job when its job stops, from the job's allocations.
What it cannot see, this catches: a suspension that failed on the last reconcile that saw the
allocations, an admission whose answer was lost (the Job unsuspended, its job requeued), a
daemon that died between a job's requeue and its Job's suspension. Run at a new daemon's
first reconcile, then every `HELD_JOBS_SWEEP_S` (one list of the held Jobs).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

from scheduler.backends.base import BackendError
from scheduler.daemon.cluster import Cluster
from scheduler.daemon.workloads import LIVE, suspend_workload
from scheduler.models import Job

log = logging.getLogger("gantry.daemon")
# How often (daemon clock, s) after the first: the Jobs that stop in Gantry are suspended by
# reconcile as they stop; this is the backstop, and a list of every held Job costs a call.
HELD_JOBS_SWEEP_S = 10.0


@runtime_checkable
class HeldJobs(Protocol):
    """A backend that lists the Jobs Gantry's webhook held, and suspends one (Kubernetes)."""

    def list_held_jobs(self) -> list[dict[str, Any]]: ...

    def suspend_workload(self, namespace: str, workload: str) -> None: ...


def suspend_strays(cluster: Cluster) -> int:
    """Suspend every held Job that runs while its Gantry job is not live (queued, preempted,
    ended, or no job at all: nothing but Gantry resumes a held Job). Returns how many; a list
    that fails is tried at the next sweep, a suspension that fails likewise."""
    backend = cluster.backend
    if not isinstance(backend, HeldJobs):
        return 0
    try:
        listed = backend.list_held_jobs()
    except BackendError as error:
        log.warning("listing held Jobs failed (tried again next sweep): %s", error)
        return 0
    resumed = {
        str(o["metadata"]["uid"]): o["metadata"]
        for o in listed
        if (o.get("spec") or {}).get("suspend") is False
    }
    if not resumed:
        return 0
    live = set(
        Job.objects.filter(spec__workload__uid__in=list(resumed), state__in=LIVE).values_list(
            "spec__workload__uid", flat=True
        )
    )
    strays = [meta for uid, meta in resumed.items() if uid not in live]
    for meta in strays:
        namespace, name = meta["namespace"], meta["name"]
        log.warning("Job %s/%s runs without a live Gantry job: suspending it", namespace, name)
        suspend_workload(cluster, namespace, f"jobs/{name}")
    return len(strays)
