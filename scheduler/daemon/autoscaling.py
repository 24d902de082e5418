"""Inference autoscaling: each running inference job's replica target from the backend's
load signal."""

from __future__ import annotations

import logging
import math

from scheduler.backends.base import InferenceLoad
from scheduler.leader import Lease
from scheduler.models import (
    Allocation,
    Job,
    JobState,
)

log = logging.getLogger("gantry.daemon")
S = JobState


def autoscale(backend: object, lease: Lease) -> int:
    """Set each running inference job's replica target from the backend's load signal,
    between its min and max replicas. Growth is placed by the engine (within quota, as
    preemptible elastic replicas); shrinking stops the highest replicas first."""
    if not isinstance(backend, InferenceLoad):
        return 0
    load = backend.inference_load
    rows = Job.objects.filter(job_type="inference", state=S.RUNNING).values(
        "id", "replicas", "spec"
    )
    targets = {}
    for row in rows:
        low = row["spec"].get("min_replicas") or row["replicas"]
        high = row["spec"].get("max_replicas") or low
        want = max(low, min(high, math.ceil(load(row["id"]))))
        if want != row["replicas"]:
            targets[row["id"]] = want
    if not targets:
        return 0
    with lease.writing():
        for job_id, want in targets.items():
            Job.objects.filter(id=job_id, state=S.RUNNING).update(replicas=want)
            Allocation.objects.filter(
                job_id=job_id, replica__gte=want, ended_at__isnull=True, end_reason=""
            ).update(end_reason="scaled down")
    log.info("inference targets: %s", targets)
    return len(targets)
