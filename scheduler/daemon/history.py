"""What a job's history keeps of its waiting (issue 35, item 5): each distinct wait reason,
the preemptions it caused, and where it stands when a preemption sent it back to the queue.

A reason is refreshed every few cycles and its figures move ("uses 14/16", "in 40 s"): an
event per refresh would bury the history. An event is written when the reason's *shape*
changes (its text with the numbers taken out: `reason_shape`), at most
`WAIT_EVENTS_PER_JOB` per job, so a job whose reason flips back and forth stops adding
events. The texts name other jobs and tenants as the reasons do; `reason_text.ReasonReader`
rewrites them for each reader, as it does the reasons.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count

from scheduler.core.quota import gpus
from scheduler.core.types import (
    MILLI_PER_GPU,
    PlannedPreemption,
    Preemption,
    PreemptionCause,
    RunningJob,
    WaitReason,
)
from scheduler.jobs.transitions import insert_events
from scheduler.models import Job, JobEvent, JobState
from scheduler.snapshot.translate import job_pk

WAIT_KIND = "waiting"
PREEMPTING_KIND = "preempting"
# A job whose reason changes shape more often than this (flapping between two causes) has
# told its story; later shapes are not recorded.
WAIT_EVENTS_PER_JOB = 20

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
# A duration as `reasons.in_time` words it: "40 s", "about 2 min", "about 3 h".
_DURATION = re.compile(r"(?:about )?# (?:s|min|h)\b")


def reason_shape(text: str) -> str:
    """The reason without its figures (durations whatever their unit): two texts of one
    shape are one reason to a reader."""
    return _DURATION.sub("#", _NUMBER.sub("#", text))


def wait_data(reason: WaitReason, now: datetime, engine_now: float) -> dict[str, Any]:
    """A waiting event's structured fields: the code, and the planned preemption (when,
    cause, how many victims, GPUs, flavor): counts only, no job ids or tenant names, so
    that every reader of the job may read them as they are."""
    data: dict[str, Any] = {"code": str(reason.code)}
    if reason.plan is not None:
        data["plan"] = plan_data(reason.plan, now, engine_now)
    return data


def plan_data(plan: PlannedPreemption, now: datetime, engine_now: float) -> dict[str, Any]:
    at = now + timedelta(seconds=max(0.0, plan.at - engine_now))
    return {
        "at": at.isoformat(),
        "cause": str(plan.cause),
        "victims": len(plan.victims),
        "gpus": float(gpus(plan.milli)),
        "flavor": plan.flavor,
    }


def write_wait_events(changes: Mapping[int, tuple[str, dict[str, Any]]]) -> int:
    """A waiting event for each job (still queued) of ``changes`` (job id -> its new reason
    and the event's data), unless it has WAIT_EVENTS_PER_JOB already. In the transaction
    that writes the reasons."""
    if not changes:
        return 0
    queued = set(
        Job.objects.filter(id__any=list(changes), state=JobState.QUEUED).values_list(
            "id", flat=True
        )
    )
    counts = dict(
        JobEvent.objects.filter(job_id__any=list(queued), kind=WAIT_KIND)
        .values_list("job_id")
        .annotate(n=Count("id"))
    )
    rows = [
        (job_id, WAIT_KIND, "", "", text, data)
        for job_id, (text, data) in changes.items()
        if job_id in queued and counts.get(job_id, 0) < WAIT_EVENTS_PER_JOB
    ]
    insert_events(rows)
    return len(rows)


def preemptor_rows(
    preemptions: Sequence[tuple[int, Preemption]], running: Mapping[int, RunningJob]
) -> list[tuple[Any, ...]]:
    """One "preempting" event per preemptor and cause among the preemptions written this
    cycle (victim id, Preemption): "Preempted job 12: team-a reclaims its guarantee from
    team-b, which borrows (8 GPUs, 2412 GPU-seconds of work lost)." The victims' ids and
    the other tenant's slug are hidden from readers who may not see them (`reason_text`)."""
    grouped: dict[tuple[int, str], list[tuple[int, Preemption]]] = defaultdict(list)
    for victim, p in preemptions:
        grouped[(job_pk(p.preemptor), _cause_text(p))].append((victim, p))
    rows = []
    for (preemptor, why), group in sorted(grouped.items()):
        ids = ", ".join(str(victim) for victim, _ in group)
        named = f"job {ids}" if len(group) == 1 else f"job(s) {ids}"
        if group[0][1].cause == PreemptionCause.ELASTIC:
            named = f"replicas of {ids}"
        milli = sum(_held(running.get(victim), p) for victim, p in group)
        lost = round(sum(p.work_lost_gpu_s for _, p in group))
        unit = "GPU" if milli <= MILLI_PER_GPU else "GPUs"
        message = f"Preempted {named}{why} ({gpus(milli)} {unit}, {lost} GPU-seconds of work lost)."
        data = {
            "cause": str(group[0][1].cause or ""),
            "victims": len(group),
            "gpus": float(gpus(milli)),
            "work_lost_gpu_s": lost,
        }
        rows.append((preemptor, PREEMPTING_KIND, "", "", message, data))
    return rows


def _cause_text(p: Preemption) -> str:
    """What follows the victims' names: the reclaim as the engine words it (it names both
    tenants), or the cause."""
    if p.cause == PreemptionCause.RECLAIM:
        return f": {p.reason}"
    return {
        PreemptionCause.PRIORITY: ", of lower priority",
        PreemptionCause.BEST_EFFORT: ", of best-effort class",
        PreemptionCause.ELASTIC: ", elastic replicas above their minimum",
    }.get(p.cause or PreemptionCause.PRIORITY, "")


def _held(running: RunningJob | None, p: Preemption) -> int:
    """Milli-GPU the preemption stops: the whole job's, or the replicas named."""
    if running is None:
        return 0
    return sum(a.gpu_milli for a in running.assignments if p.whole_job or a.replica in p.replicas)


def requeue_standing(jobs: Sequence[Mapping[str, Any]]) -> dict[int, str]:
    """For preempted jobs about to be requeued (rows with id, tenant_id, priority_class_id,
    created_at): where each will stand, in words. The queue orders a team's jobs by class
    (with aging), then by when they were queued; a requeued job is queued anew, so the
    waiting jobs of its team and class submitted after it stand ahead of it."""
    out = {}
    for job in jobs:
        later = Job.objects.filter(
            tenant_id=job["tenant_id"],
            priority_class_id=job["priority_class_id"],
            state=JobState.QUEUED,
            created_at__gt=job["created_at"],
        ).count()
        if later:
            counted = "1 job" if later == 1 else f"{later} jobs"
            verb = "stands" if later == 1 else "stand"
            out[job["id"]] = (
                f"its place counts from its requeue, so {counted} of its team and class "
                f"submitted after it {verb} ahead of it"
            )
        else:
            out[job["id"]] = (
                "its place counts from its requeue; no job of its team and class submitted "
                "after it waits ahead of it"
            )
    return out
