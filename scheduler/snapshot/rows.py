"""Job rows as the daemon reads them: the columns, read by row version (PostgreSQL `xmin`)
so that a cycle reads whole only the rows that changed, and SQL compiled once per process."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from django.db.models import Exists, OuterRef
from django.db.models.expressions import RawSQL
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from scheduler.models import (
    Allocation,
    JobState,
)

log = logging.getLogger("gantry.daemon")
S = JobState


JOB_FIELDS = (
    "id",
    "tenant_id",
    "project_id",
    "priority_class_id",
    "job_type",
    "state",
    "replicas",
    "gpu_milli_per_replica",
    "gpu_memory_mib",
    "cpu_milli",
    "memory_mib",
    "flavors",
    "max_runtime_s",
    "attempt",
    "queued_at",
    "started_at",
    "not_before",
    "reason",
    "submitted_by_id",
    "project__namespace",
    "name",
)


# The spec keys the engine needs, read as JSON paths so the whole spec (commands,
# environment) is not parsed for every job of every cycle.
SPEC_KEYS = {
    "min_replicas": "spec__min_replicas",
    "pools": "spec__pools",
    "estimated_runtime_s": "spec__estimated_runtime_s",
    "checkpointable": "spec__checkpointable",
    "rdma": "spec__resources__rdma",
    "placement": "spec__placement",
}


# Read with the rows for the daemon's reconcile, not the engine.
ROW_EXTRA = ("spec__retry",)
# What a pod is rendered from, read with the rows so that allocating reads no spec again
# (`scheduler.daemon.apply.pod_request`).
POD_KEYS = {
    "image": "spec__image",
    "command": "spec__command",
    "env": "spec__env",
    "priority_class": "spec__priority_class",
    "simulation": "spec__simulation",
    "workload": "spec__workload",
}


ROW_FIELDS = (*JOB_FIELDS, *SPEC_KEYS.values(), *ROW_EXTRA, *POD_KEYS.values())


def aware(value: datetime | str) -> datetime:
    """A time read through a raw cursor, as the ORM would give it: aware, in UTC. SQLite
    stores times as naive UTC text, and a raw cursor bypasses the ORM's converters; compared
    with an aware time, a naive one raises TypeError (which once stopped the daemon for good
    after the first preemption on the embedded default)."""
    if isinstance(value, str):
        parsed = parse_datetime(value)
        if parsed is None:
            raise ValueError(f"not a time: {value!r}")
        value = parsed
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


def ts(value: datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0


def holds_allocation() -> Exists:
    """For `Job.objects.filter(...)`: the job holds an active allocation."""
    return Exists(Allocation.objects.filter(job_id=OuterRef("pk"), ended_at__isnull=True))


# A row's version on PostgreSQL: the id of the transaction that wrote it.
_VERSION = RawSQL("scheduler_job.xmin::text::bigint", ())
