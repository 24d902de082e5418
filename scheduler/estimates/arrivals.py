"""The recent submissions the start estimates expect more of (`scheduler.sim.arrivals`).

Read at each refresh when GANTRY_ETA_ARRIVALS_WINDOW_S is set: the jobs created within
`sim.arrivals.LATE_WINDOWS` times that window (the p90 replay's streams are read over that
long, the p50's over the window alone; a requeue is no new arrival: `created_at`, not
`queued_at`), whatever they became since, the latest ARRIVAL_ROWS of them, as the engine's
job requests submitted at their creation, with their groups for the runtime model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from scheduler.clusters.selectors import cluster_labels
from scheduler.models import Job
from scheduler.sim.arrivals import (
    LATE_WINDOWS,
    ExpectedRanges,
    Stream,
    arrival_streams,
    expected_ranges,
)
from scheduler.sim.runtimes import Groups
from scheduler.snapshot.rows import JOB_FIELDS, SPEC_KEYS
from scheduler.snapshot.translate import core_job_id, job_request
from tenants.models import PriorityClass, Tenant

if TYPE_CHECKING:  # the engine's types are built by the door (`snapshot.translate`) alone
    from scheduler.core.types import JobRequest

# At most this many recent submissions are read: the streams' paces need a few of each,
# not every one of a burst.
ARRIVAL_ROWS = 2000

GroupsOf = Callable[[Mapping[str, Any]], Groups]  # a job row's groups (`refresh.job_groups`)


def recent_streams(
    now: float, window_s: float, groups_of: GroupsOf
) -> tuple[tuple[Stream, ...], dict[str, Groups]]:
    """The streams of the jobs created in `(now - window_s, now]` (the daemon's clock, epoch
    seconds), and the groups of those jobs (core id -> groups)."""
    jobs, groups = recent_jobs(now, window_s, groups_of)
    return arrival_streams(jobs, now, window_s=window_s), groups


def recent_jobs(
    now: float, window_s: float, groups_of: GroupsOf
) -> tuple[list[JobRequest], dict[str, Groups]]:
    """The jobs created in `(now - window_s, now]`, as submitted then, and their groups."""
    at = datetime.fromtimestamp(now, tz=UTC)
    rows = (
        Job.objects.filter(created_at__gt=at - timedelta(seconds=window_s), created_at__lte=at)
        .order_by("-created_at")
        .values(*JOB_FIELDS, *SPEC_KEYS.values(), "created_at")[:ARRIVAL_ROWS]
    )
    slugs = dict(Tenant.objects.values_list("id", "slug"))
    classes = {pc["id"]: pc for pc in PriorityClass.objects.values("id", "name")}
    clusters = cluster_labels()
    jobs, groups = [], {}
    for row in rows:
        if row["priority_class_id"] not in classes:
            continue
        job = job_request(row, slugs, classes, clusters)
        jobs.append(replace(job, submitted_at=row["created_at"].timestamp()))
        groups[core_job_id(row["id"])] = groups_of(row)
    return jobs, groups


def arrivals_expected(
    now: float,
    groups_of: GroupsOf,
    *,
    window_s: float,
    max_count: int,
    late_windows: float = LATE_WINDOWS,
) -> tuple[ExpectedRanges, dict[str, Groups]]:
    """The arrivals each replay expects (`sim.arrivals.expected_ranges`: within `window_s`
    after `now` from those within `window_s` before it for the p50, `late_windows` times
    as far for the p90; at most `max_count` each), and the groups of the jobs they are like."""
    jobs, groups = recent_jobs(now, window_s * max(1.0, late_windows), groups_of)
    found = expected_ranges(
        jobs, now, window_s=window_s, max_count=max_count, late_windows=late_windows
    )
    return found, {like: groups[like] for like in found.templates}
