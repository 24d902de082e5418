"""The workload controller (issue 37): what the webhook held becomes a Gantry job, and what
Gantry decides is told back to the user in Kubernetes.

One pass (`sync`) reads every held pod and Job (label `gantry.io/managed=true`) and then:
1. mirrors each batch/v1 Job, each single pod, and each pod group once all of its pods exist,
   into a Gantry job (`mirror`); an object Gantry cannot queue gets a Warning event saying
   why, once; a TrainJob's runtime is read as it is mirrored (the initializers it declares
   count, `companions.py`);
2. cancels the job of a workload that was deleted (its quota is freed);
3. writes an event on the workload (the Job, or each of its pods) when its job's state or
   reason changed: `kubectl describe` shows why it waits ("waiting: team nlp's H100 quota
   is full"), its place in the queue and start estimate, an approval pending, its
   admission, its preemption, its end.

The daemon admits what it placed (a pod's gate removed and the pod bound; a Job labelled and
unsuspended, its pods bound as they come); the controller never writes a workload. A pass
that cannot list changes nothing: an object not listed because the API server did not answer
is not a deleted one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from common.db.shared_reads import shared_reads
from scheduler.backends.base import BackendError
from scheduler.models import FINAL_STATES, Job, JobQueueEstimate, JobState
from scheduler.workloads.companions import runtime_ref
from scheduler.workloads.kinds import LEADERWORKERSET, TRAINJOB, Kind, at
from scheduler.workloads.mirror import (
    Mirrored,
    end_deleted,
    end_finished,
    mirror_object,
    mirror_pods,
    mirrored_jobs,
    without_pods,
    workload_uid,
)
from scheduler.workloads.order import class_values, queue_order
from scheduler.workloads.queued_kinds import CUSTOM, QUEUED, end_message, is_lws_pod, lws_groups
from scheduler.workloads.shape import Refused, Shaped, group_of
from scheduler.workloads.shape_kinds import shape_trainjob
from scheduler.workloads.status import ANNOTATION_REASON, ANNOTATION_STATUS, status_annotations

log = logging.getLogger("gantry.workloads")
Obj = dict[str, Any]
S = JobState
# An object an event is about: (namespace, name, apiVersion, kind, uid).
Ref = tuple[str, str, str, str, str]
# What a pass tells about one workload: its objects, the reason (Queued, Admitted...), the
# message, whether it is a warning, and whether it is news for an event (a queued job's new
# place in the queue is written to its status annotations alone: `_report`).
Tell = tuple[Sequence[Ref], str, str, bool, bool]
# A queued job's place, as its annotation shows it: its position in its team's queue, and its
# estimated start to the minute ("" when none).
Place = tuple[int, str]
# The columns of a job's place, read with its state each pass (`_report`).
PLACE_COLUMNS = ("queue_estimate__position_tenant", "queue_estimate__eta_p50")
MINUTE = "%Y-%m-%d %H:%M UTC"

# The event's reason (CamelCase, as Kubernetes writes them) for each state of the job.
REASONS = {
    S.PENDING_APPROVAL: "WaitingForApproval",
    S.QUEUED: "Queued",
    S.ADMITTED: "Admitted",
    S.BINDING: "Admitted",
    S.RUNNING: "Running",
    S.PREEMPTED: "Preempted",
    S.SUCCEEDED: "Succeeded",
    S.FAILED: "Failed",
    S.CANCELLED: "Cancelled",
    S.REJECTED: "Rejected",
}
WARNINGS = frozenset({S.PREEMPTED, S.FAILED, S.REJECTED})
# The states in which the daemon ends a job from its pods (a kind whose pods outlive its end,
# a RayJob's cluster, is ended by the controller even then).
DAEMONS_TO_END = frozenset({S.ADMITTED, S.BINDING, S.RUNNING})
# The states in which a job whose object failed before any pod of its attempt was adopted
# fails with it: placed, its pods not made (admitted: claimed, the object perhaps resumed).
PODLESS_FAILS = frozenset({S.ADMITTED, S.BINDING})
# The kinds a mirrored job's workload may record (a LeaderWorkerSet's group: its pods).
KINDS_MIRRORED = frozenset({"Pod", LEADERWORKERSET.kind, *QUEUED})
# Events and status annotations written at once by a pass (`WorkloadController._tell_all`):
# the API server's client is shared by the threads, and its connection pool holds ten.
TELLERS = 8
# Objects with tells waiting to be written in the background before a pass waits for the
# oldest (an object's unsent tells are one write: `WorkloadController._tell_all`).
MAX_TELLS = 1000
# Seconds a pass spends queueing new workloads before it lists again (`sync`): a burst of
# thousands is queued over several passes, and what arrives meanwhile is queued in class order
# among what is left, not after the whole burst.
QUEUEING_BUDGET_S = 1.0
# How long the submissions' reads of the platform's configuration (the nodes' inventory,
# approval policies, registries, priority defaults, flavors and rate cards, the submitting
# user and project) serve the passes after the one that read them (common/db/shared_reads):
# Jobs created at a steady rate come one or two a pass, each pass reading it all again.
SHARED_READS_S = 2.0
# A queued workload's place (its position in its team's queue, its estimated start to the
# minute) as its status annotation shows it is rewritten when it changed, at most once per
# PLACE_EVERY_S per workload, and at most PLACES_PER_S a second in all (a long queue's places
# move at every admission ahead: each rewrite is a call to the API server). Events are not
# written for it: `kubectl describe` would fill with them.
PLACE_EVERY_S = 60.0
PLACES_PER_S = 5.0
PLACES_BURST = 50
# A workload Gantry could not queue is tried again when it changes, or after this long (what
# refused it may be the platform's to fix: a priority class or a membership not made yet, a
# node the cluster lacks), not at every pass: each try is a whole submission.
REFUSED_RETRY_S = 30.0


class Teller(Protocol):
    """How the controller tells a user about an object: events and Gantry's status annotations."""

    def record_event(
        self,
        namespace: str,
        pod: str,
        reason: str,
        message: str,
        warning: bool = False,
        about: tuple[str, str, str] = ("v1", "Pod", ""),
    ) -> None: ...

    def annotate(
        self, namespace: str, name: str, about: tuple[str, str, str], annotations: dict[str, str]
    ) -> None: ...


class HeldObjects(Teller, Protocol):
    """What the controller needs of the cluster (the Kubernetes backend provides it)."""

    def list_held_pods(self) -> list[Obj]: ...

    def list_held_jobs(self) -> list[Obj]: ...

    def list_held_objects(self, group: str, version: str, plural: str) -> list[Obj]: ...

    def read_training_runtime(self, namespace: str, kind: str, name: str) -> Obj | None: ...


@dataclass
class SyncStats:
    listed: int = 0
    mirrored: int = 0
    refused: int = 0  # refusals told this pass (the same one again is not counted)
    cancelled: int = 0
    events: int = 0
    # new workloads left for the next pass, this one's queueing budget spent: the loop runs
    # the next pass at once
    deferred: int = 0


@dataclass(frozen=True)
class Held:
    """One workload as listed: an object Gantry resumes (a Job, JobSet, RayJob, TrainJob), or
    a single pod or pod group (`objects`), a LeaderWorkerSet's group with its set (`owner`)."""

    kind: str  # "Pod", or a key of queued_kinds.QUEUED
    objects: tuple[Obj, ...]
    owner: Obj | None = None

    @property
    def refs(self) -> list[Ref]:
        return [_ref(o, str(o.get("apiVersion") or "v1"), self.kind) for o in self.objects]


# Gantry's own annotations on a user's object: not what the user wrote (`_written`).
STATUS_KEYS = frozenset({ANNOTATION_STATUS, ANNOTATION_REASON})


def _versions(held: Held) -> tuple[str, ...]:
    """What the user wrote of `held`'s objects (and its owner's): labels, annotations but
    Gantry's status, and spec, as a digest each. Not the resource version: Gantry's own
    status annotations change it when they tell the refusal."""
    objects = (*held.objects, *([held.owner] if held.owner is not None else []))
    return tuple(_written(o) for o in objects)


def _written(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    notes = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in STATUS_KEYS}
    mine = {"labels": meta.get("labels"), "annotations": notes, "spec": obj.get("spec")}
    text = json.dumps(mine, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _ref(obj: Obj, api_version: str, kind: str) -> Ref:
    meta = obj.get("metadata") or {}
    return (
        str(meta.get("namespace")),
        str(meta.get("name")),
        api_version,
        kind,
        str(meta.get("uid") or ""),
    )


@dataclass
class WorkloadController:
    cluster: HeldObjects
    gpu_resource: str = "nvidia.com/gpu"
    # What was last told per workload uid: the (state, reason) of its job; the refusal of
    # one that could not be queued; the workloads whose end was told (never told again).
    told: dict[str, tuple[str, str]] = field(default_factory=dict)
    refusals: dict[str, str] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    # A queued workload's place as its annotations show it, and when it was written
    # (`monotonic`); `_place_allowance`: the rewrites the rate allows now (`_report`).
    placed: dict[str, tuple[Place, float]] = field(default_factory=dict)
    _place_allowance: float = field(default=PLACES_BURST, repr=False)
    _place_checked: float | None = field(default=None, repr=False)
    # A refused workload's objects as the user wrote them (`_versions`), and when
    # (`monotonic`) it was last tried (`_resting`).
    refused_at: dict[str, tuple[tuple[str, ...], float]] = field(default_factory=dict)
    queueing_budget_s: float = QUEUEING_BUDGET_S
    monotonic: Callable[[], float] = time.monotonic
    # Tell without waiting (the deployed loop; see _tell_all).
    background_tells: bool = False
    _lanes: list[ThreadPoolExecutor] = field(default_factory=list, repr=False)
    _pending: deque[Future[None]] = field(default_factory=deque, repr=False)
    # The lane and the last tell of each object with a tell under way; the last lane taken.
    _last: dict[str, tuple[int, Future[None]]] = field(default_factory=dict, repr=False)
    _turn: int = field(default=-1, repr=False)
    # The tells of each object not yet taken by its lane, oldest first (`_tell_all`).
    _unsent: dict[str, list[Tell]] = field(default_factory=dict, repr=False)
    _unsent_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # The configuration the submissions read (`_queue_new`), and since when (`monotonic`).
    _reads: dict[Any, Any] = field(default_factory=dict, repr=False)
    _reads_since: float = field(default=-math.inf, repr=False)

    def sync(self) -> SyncStats:
        stats = SyncStats()
        # Both lists first: either raising, nothing below runs.
        pods, jobs = self.cluster.list_held_pods(), self.cluster.list_held_jobs()
        objects = [(q.kind.kind, o) for q in CUSTOM for o in self._list(q.kind)]
        sets = self._list(LEADERWORKERSET)
        jobs = [{"apiVersion": "batch/v1", "kind": "Job", **j} for j in jobs]
        stats.listed = len(pods) + len(jobs) + len(objects)
        groups, orphans = lws_groups([p for p in pods if is_lws_pod(p)], sets)
        workloads = self._pod_workloads([p for p in pods if not is_lws_pod(p)], stats)
        workloads |= {workload_uid(ps): Held("Pod", tuple(ps), owner) for owner, ps in groups}
        objects += [("Job", j) for j in jobs]
        workloads |= {str(at(o, ("metadata", "uid"))): Held(k, (o,)) for k, o in objects}
        gone = {id(o) for o in orphans}  # their set deleted: their group's job is cancelled
        pods = [p for p in pods if id(p) not in gone]
        self.ended &= set(workloads)  # forgotten once they are gone
        self.refused_at = {u: v for u, v in self.refused_at.items() if u in workloads}
        self._queue_new(workloads, stats)
        present = {(str(at(p, ("metadata", "namespace"))), _name(p)): _uid(p) for p in pods}
        self._end_deleted(present, set(workloads), stats)
        self._end_finished(objects, stats)
        self._report(stats)
        return stats

    def _list(self, kind: Kind) -> list[Obj]:
        """The held objects of a custom kind (list items may omit their kind: it is added)."""
        listed = self.cluster.list_held_objects(kind.group, kind.version, kind.plural)
        api_version = f"{kind.group}/{kind.version}"
        return [{"apiVersion": api_version, "kind": kind.kind, **o} for o in listed]

    # -- 1. mirror ------------------------------------------------------------------------

    def _pod_workloads(self, pods: Sequence[Obj], stats: SyncStats) -> dict[str, Held]:
        """Complete pod workloads by uid: each single pod, and each pod group whose pods all
        exist. A group still forming waits (its pods stay gated); a malformed one is told."""
        groups: dict[tuple[str, str], list[Obj]] = defaultdict(list)
        for pod in pods:
            namespace = str(at(pod, ("metadata", "namespace")))
            try:
                group = group_of(pod)
            except Refused as refusal:
                self._refused(workload_uid([pod]), Held("Pod", (pod,)), str(refusal), stats)
                continue
            groups[(namespace, f"group/{group[0]}" if group else f"pod/{_name(pod)}")].append(pod)
        complete: dict[str, Held] = {}
        for members in groups.values():
            group = group_of(members[0])
            if group is None or len(members) >= group[1]:
                complete[workload_uid(members)] = Held("Pod", tuple(members))
        return complete

    def _queue_new(self, workloads: dict[str, Held], stats: SyncStats) -> None:
        """Mirror the workloads not mirrored yet, highest priority class first, then oldest
        (`scheduler.workloads.order`: a burst is queued as the queue would serve it), for at
        most the queueing budget (one at least): the rest wait for the next pass, which lists
        again, so a higher class created during a long burst is queued before its lower ones."""
        now = self.monotonic()
        new = [
            (uid, held.objects[0])
            for uid, held in workloads.items()
            if not self._known(uid) and not self._resting(uid, held, now)
        ]
        ordered = queue_order(new, class_values([o for _, o in new])) if len(new) > 1 else []
        deadline = self.monotonic() + self.queueing_budget_s
        # Those mirrored before (found again after a restart) in one read for them all.
        prior = mirrored_jobs([uid for uid, _ in new]) if new else {}
        # The passes' submissions read the platform's configuration once every SHARED_READS_S
        # (common/db/shared_reads): a steady stream of Jobs came one or two a pass.
        if now - self._reads_since >= SHARED_READS_S:
            self._reads, self._reads_since = {}, now
        with shared_reads(self._reads):
            for done, uid in enumerate(ordered or [uid for uid, _ in new]):
                if done and self.monotonic() >= deadline:
                    stats.deferred = len(new) - done
                    return
                self._mirror(uid, workloads[uid], stats, prior.get)

    def _known(self, uid: str) -> bool:
        return uid in self.told or uid in self.ended

    def _resting(self, uid: str, held: Held, now: float) -> bool:
        """Refused, unchanged since, and tried within REFUSED_RETRY_S."""
        tried = self.refused_at.get(uid)
        if tried is None or tried[0] != _versions(held):
            return False
        return now - tried[1] < REFUSED_RETRY_S

    def _mirror(
        self, uid: str, held: Held, stats: SyncStats, prior: Callable[[str], Job | None]
    ) -> None:
        try:
            mirrored: Mirrored
            if held.kind in QUEUED:
                obj = held.objects[0]
                mirrored = mirror_object(obj, lambda: self._shape(held.kind, obj), prior=prior)
            else:
                mirrored = mirror_pods(
                    held.objects, gpu_resource=self.gpu_resource, owner=held.owner, prior=prior
                )
        except Refused as refusal:
            self.refused_at[uid] = (_versions(held), self.monotonic())
            self._refused(uid, held, str(refusal), stats)
            return
        except BackendError as error:  # its runtime could not be read: the next pass reads it
            log.warning("%s %s not queued yet: %s", held.kind, _name(held.objects[0]), error)
            return
        stats.mirrored += int(mirrored.created)
        self.refusals.pop(uid, None)
        self.refused_at.pop(uid, None)
        # Found again after a restart: told once more, unless the object shows it already.
        self.told[uid] = _shown(held, mirrored.job)

    def _shape(self, kind: str, obj: Obj) -> Shaped:
        """What `obj` of a queued kind asks for; a TrainJob's with the initializers of the
        runtime it names (read now: a runtime that does not exist counts none; a read that
        fails raises BackendError, and the TrainJob alone waits for the next pass)."""
        if kind != TRAINJOB.kind:
            return QUEUED[kind].shape(obj, self.gpu_resource)
        runtime = None
        if (ref := runtime_ref(obj)) is not None:
            namespace = str(at(obj, ("metadata", "namespace")))
            runtime = self.cluster.read_training_runtime(namespace, *ref)
        return shape_trainjob(obj, self.gpu_resource, runtime)

    def _refused(self, uid: str, held: Held, why: str, stats: SyncStats) -> None:
        """Tell why `held` cannot be queued, once per reason (`stats.refused` counts the
        refusals told: the same one found again is no news)."""
        if self.refusals.get(uid) == why:
            return
        stats.refused += 1
        self.refusals[uid] = why
        # a reason may end its own sentence (the job spec's errors do): one full stop
        message = (
            f"Gantry cannot queue this workload: {why.rstrip('.')}. It stays held until fixed."
        )
        self._write([(held.refs, "Refused", message, True, True)], stats)

    # -- 2. deleted -----------------------------------------------------------------------

    def _end_deleted(
        self, present: dict[tuple[str, str], str], uids: set[str], stats: SyncStats
    ) -> None:
        """A pod workload is gone when any of its pods is, or was made again under its name
        (another uid: a LeaderWorkerSet's StatefulSet remakes a preempted group's pods, which
        are a new group, queued as a new job)."""
        live = Job.objects.filter(spec__workload__kind__in=[*KINDS_MIRRORED]).exclude(
            state__in=FINAL_STATES
        )
        # Each pass reads every live mirrored job: their workloads alone, not whole jobs (a
        # pass of a burst of thousands spent seconds building them); the gone are read whole.
        for pk, workload in list(live.values_list("pk", "spec__workload")):
            if not workload.get("pods"):
                gone = [] if workload["uid"] in uids else [f"{workload['kind']} {workload['name']}"]
            else:
                names = workload["pods"]
                uids_of = workload.get("uids") or [""] * len(names)
                gone = [
                    f"pod {name}"
                    for name, uid in zip(names, uids_of, strict=True)
                    if _gone(present.get((workload["namespace"], name)), uid)
                ]
            if not gone:
                continue
            job = Job.objects.select_related("submitted_by", "tenant").filter(pk=pk).first()
            if job is not None and end_deleted(job, gone[0]) is not None:
                stats.cancelled += 1

    def _end_finished(self, listed: Sequence[tuple[str, Obj]], stats: SyncStats) -> None:
        """An object its controller marked complete or failed while its Gantry job was not
        placed (its pods finished just as Gantry preempted it, and it was queued again): the
        job ends, as its object did. A placed job's end (admitted, binding, running) is read
        from its pods by the daemon, but for a kind whose pods outlive its end (a RayJob's
        cluster), for an object that failed while its job runs (its operator deletes the pods
        it still runs: read by the daemon as gone with a lost node, the attempt was requeued,
        then cancelled), and for an object that failed while its job is admitted or waits in
        binding with no pod adopted (a Job whose backoffLimit was reached as it was admitted
        again, or while the daemon that admitted it was down before committing): no pod will
        come to bind, so its job fails now with the object's reason, not at the binding
        deadline."""
        ended, running, why = {}, set(), {}
        for kind, obj in listed:
            if (outcome := QUEUED[kind].ended(obj)) is not None:
                uid = str(at(obj, ("metadata", "uid")))
                ended[uid], why[uid] = outcome, end_message(obj)
                if QUEUED[kind].ends_running:
                    running.add(uid)
        if not ended:
            return
        live = list(
            Job.objects.filter(spec__workload__uid__in=list(ended))
            .exclude(state__in=FINAL_STATES)
            .select_related("submitted_by", "tenant")
        )
        waiting = [
            j
            for j in live
            if j.state in PODLESS_FAILS and ended[j.spec["workload"]["uid"]] == "failed"
        ]
        podless = without_pods(waiting)
        for job in live:
            uid = job.spec["workload"]["uid"]
            # A running job whose object failed fails with it: its operator deletes the pods
            # it still runs (a Job's active pods, a JobSet's Jobs), which the daemon would
            # read as vanished on a lost node and requeue.
            failed_running = job.state == S.RUNNING and ended[uid] == "failed"
            if job.state in DAEMONS_TO_END and not (
                uid in running or job.pk in podless or failed_running
            ):
                # admitted with its pods bound or being bound, or running to completion: the
                # daemon reads their end from the pods (a short job whose condition landed
                # before the daemon saw it run succeeds, it is not cancelled)
                continue
            if end_finished(job, ended[uid], why[uid]) is not None:
                stats.cancelled += 1

    # -- 3. report ------------------------------------------------------------------------

    def _report(self, stats: SyncStats) -> None:
        """An event for each workload whose job changed since it was last told (jobs ended
        since the last pass are told once more: their end is news), and the status
        annotations of the queued ones whose place in the queue moved (`_moves`)."""
        uids = list(self.told)
        if not uids:
            return
        # What each job is now, in a few columns (every told job is read each pass); the
        # changed and moved ones are then read whole, with their estimates.
        rows = Job.objects.filter(spec__workload__uid__in=uids).values_list(
            "pk", "state", "reason", "spec__workload__uid", *PLACE_COLUMNS
        )
        changed, queued = [], []
        for pk, state, reason, uid, *place in rows:
            if self.told.get(uid) != (state, reason):
                changed.append(pk)
            elif state == S.QUEUED and place[0] is not None:
                queued.append((pk, uid, _place(*place)))
        moved = self._moves(queued)
        if not (changed or moved):
            return
        wanted = [*changed, *moved]
        jobs = list(Job.objects.filter(pk__in=wanted).select_related("project").order_by("pk"))
        estimates = {e.job_id: e for e in JobQueueEstimate.objects.filter(job__in=wanted)}
        tells: list[Tell] = []
        for job in jobs:
            workload = job.spec["workload"]
            uid, estimate = workload["uid"], estimates.get(job.pk)
            now = (job.state, job.reason)
            before = self.told.get(uid)
            news = before != now
            if not news and job.pk not in moved:
                continue  # changed back between the two reads
            self.told[uid] = now
            state = S(job.state)
            if state == S.QUEUED and estimate is not None:
                self.placed[uid] = (_place_of(estimate), self.monotonic())
            else:
                self.placed.pop(uid, None)
            if news and before is not None and _same_tell(before, now):
                continue  # admitted, then binding: the user was told that already
            tells.append(
                (
                    _refs(workload),
                    REASONS.get(state, "Changed"),
                    describe(job, estimate),
                    state in WARNINGS or (state in DAEMONS_TO_END and bool(job.reason)),
                    news,
                )
            )
            if state in FINAL_STATES:
                del self.told[uid]
                self.ended.add(uid)
        self._tell_all(tells, stats)

    def _moves(self, queued: Sequence[tuple[int, str, Place]]) -> set[int]:
        """The queued jobs (pk, workload uid, place now) whose annotations are rewritten now:
        those whose place changed since it was written, not within PLACE_EVERY_S of that,
        never shown a place first, then the longest shown, as many as the rate allows."""
        now = self.monotonic()
        if self._place_checked is not None:
            earned = (now - self._place_checked) * PLACES_PER_S
            self._place_allowance = min(PLACES_BURST, self._place_allowance + earned)
        self._place_checked = now
        due = []
        for pk, uid, place in queued:
            shown = self.placed.get(uid)
            if shown is None:
                due.append((-math.inf, pk))
            elif shown[0] != place and now - shown[1] >= PLACE_EVERY_S:
                due.append((shown[1], pk))
        due.sort()
        taken = due[: int(self._place_allowance)]
        self._place_allowance -= len(taken)
        return {pk for _, pk in taken}

    def _tell_all(self, tells: Sequence[Tell], stats: SyncStats) -> None:
        """Each (refs, reason, message, warning) told (an event and the status annotations:
        two calls to the API server), many at once over TELLERS lanes, a thread each, taken in
        turn: an object's tells go by the lane of its write still under way, if any, so they
        land in the order they were made. The calls touch no database.

        In the background (`background_tells`, the deployed loop) the pass does not wait for
        them, and the next pass's queueing goes on while they are written (a burst's jobs are
        queued, admitted and ended within seconds: a tell each, on an API server that is
        slowest then). An object's tells made before its lane took the first are written
        together (`_write`): an event each, a waiting reason that changed again (its place in
        the queue, its estimate) only as it is now, and the annotations once, as they are now.
        So a slow API server gets fewer calls, not a longer backlog. A backlog of MAX_TELLS
        objects waits for its oldest. Otherwise the pass waits for its own."""
        if not self.background_tells and len(tells) < 2:
            for tell in tells:
                self._write([tell], stats)
            return
        if not self._lanes:
            self._lanes = [
                ThreadPoolExecutor(1, thread_name_prefix=f"gantry-tell-{i}") for i in range(TELLERS)
            ]
        self._last = {uid: lane for uid, lane in self._last.items() if not lane[1].done()}
        counts: list[SyncStats] = []
        futures = []
        for tell in tells:
            uid = tell[0][0][4]
            with self._unsent_lock:
                waiting = self._unsent.get(uid)
                if waiting is not None:  # its lane has not taken them yet: written with them
                    waiting.append(tell)
                    continue
                self._unsent[uid] = [tell]
            if uid in self._last:
                lane = self._last[uid][0]
            else:
                lane = self._turn = (self._turn + 1) % TELLERS
            count = SyncStats()
            future = self._lanes[lane].submit(self._send_unsent, uid, count)
            self._last[uid] = (lane, future)
            counts.append(count)
            futures.append(future)
        if self.background_tells:
            self._pending = deque(f for f in self._pending if not f.done())
            self._pending.extend(futures)
            while len(self._pending) > MAX_TELLS:
                self._pending.popleft().result()
            return
        for future in futures:
            future.result()  # _write logs and swallows a failed call: this only waits
        stats.events += sum(count.events for count in counts)

    def _send_unsent(self, uid: str, stats: SyncStats) -> None:
        """In a lane: the object's tells made so far, taken at once and written."""
        with self._unsent_lock:
            tells = self._unsent.pop(uid, [])
        self._write(tells, stats)

    def close(self) -> None:
        """Wait for the tells still being written, and stop their threads."""
        lanes, self._lanes = self._lanes, []
        for lane in lanes:
            lane.shutdown(wait=True)
        self._pending.clear()
        self._last.clear()
        self._unsent.clear()

    def _write(self, tells: Sequence[Tell], stats: SyncStats) -> None:
        """One object's tells, oldest first: an event for each that is news (a run of one
        reason, such as Queued, as the last of it: the place and estimate it gave before are
        out of date; news if any of the run was), then the status annotations once, as the
        last tell says."""
        kept: list[Tell] = []
        for tell in tells:
            if kept and kept[-1][1] == tell[1]:
                kept[-1] = (*tell[:4], tell[4] or kept[-1][4])
            else:
                kept.append(tell)
        for refs, reason, message, warning, news in kept:
            if not news:
                continue  # a queued job's new place: its annotations alone
            for namespace, name, api_version, kind, uid in refs:
                try:
                    self.cluster.record_event(
                        namespace, name, reason, message, warning, (api_version, kind, uid)
                    )
                    stats.events += 1
                except Exception as error:  # an event is best effort: the next change tells
                    log.warning("event on %s/%s not written: %s", namespace, name, error)
        if not kept:
            return
        refs, reason, message, _, _ = kept[-1]
        for namespace, name, api_version, kind, uid in refs:
            about = (api_version, kind, uid)
            try:  # the same, kept current on the object (scheduler/workloads/status.py)
                self.cluster.annotate(namespace, name, about, status_annotations(reason, message))
            except Exception as error:
                log.warning("status of %s/%s not written: %s", namespace, name, error)


def _same_tell(before: tuple[str, str], now: tuple[str, str]) -> bool:
    """Whether the user already read what `now` would tell: two states told with one word
    (admitted and binding are both `Admitted`, their message the same) and the same reason.
    A second event would repeat the first word for word in `kubectl describe`."""
    if not before[0]:
        return False  # nothing shown yet (`_shown`: a restarted controller tells it once more)
    return REASONS.get(S(before[0])) == REASONS.get(S(now[0])) and before[1] == now[1]


def _shown(held: Held, job: Job) -> tuple[str, str]:
    """What `held`'s objects show of `job` in their status annotations (scheduler/workloads/
    status.py), as `told` keeps it: the job's (state, reason) when each object shows that
    state's word and the reason, so that a restarted controller does not tell again what was
    told; ("", "") otherwise (and for an ended job: its end is told, once more)."""
    state = S(job.state)
    if state in FINAL_STATES:
        return ("", "")
    for obj in held.objects:
        annotations = at(obj, ("metadata", "annotations")) or {}
        if annotations.get(ANNOTATION_STATUS) != REASONS.get(state):
            return ("", "")
        if job.reason.rstrip(".") not in str(annotations.get(ANNOTATION_REASON, "")):
            return ("", "")
    return (job.state, job.reason)


def _refs(workload: dict[str, Any]) -> list[Ref]:
    """The objects a mirrored workload's events are about: its Job, or each of its pods."""
    namespace = workload["namespace"]
    if not workload.get("pods"):
        api_version, kind = workload["apiVersion"], workload["kind"]
        return [(namespace, workload["name"], api_version, kind, workload["uid"])]
    uids = workload.get("uids") or [""] * len(workload["pods"])
    return [(namespace, n, "v1", "Pod", u) for n, u in zip(workload["pods"], uids, strict=True)]


def _place(position: int, p50: datetime | None) -> Place:
    return (position, p50.strftime(MINUTE) if p50 is not None else "")


def _place_of(estimate: JobQueueEstimate) -> Place:
    return _place(estimate.position_tenant, estimate.eta_p50)


def describe(job: Job, estimate: JobQueueEstimate | None = None) -> str:
    """What the user reads in `kubectl describe`: the job, its state and why, in plain words."""
    head = f"Gantry job {job.pk} in project {job.project.slug}"
    reason = job.reason.rstrip(".")
    state = S(job.state)
    if state == S.PENDING_APPROVAL:
        return f"{head} is {reason or 'waiting for approval'}."
    if state == S.QUEUED:
        text = f"{head} is queued: {reason or 'waiting for its turn'}."
        if estimate is not None:
            text += f" Position {estimate.position_tenant} in the team's queue"
            if estimate.eta_p50 is not None:
                p50 = estimate.eta_p50.strftime(MINUTE)
                text += f", estimated start {p50}"
            text += "."
        return text
    # A placed job's reason is news about it (its companion pod failed: daemon/companions/faults.py)
    also = f" Warning: {reason}." if reason else ""
    if state in (S.ADMITTED, S.BINDING):
        return f"{head} is admitted: its pods are being placed on the nodes Gantry chose.{also}"
    if state == S.RUNNING:
        return f"{head} is running.{also}"
    if state == S.PREEMPTED:
        return f"{head} was preempted: {reason or 'another job needed its GPUs'}."
    word = {S.SUCCEEDED: "succeeded", S.FAILED: "failed", S.CANCELLED: "was cancelled"}
    ended = word.get(state, "was rejected")
    return f"{head} {ended}" + (f": {reason}." if reason else ".")


def _name(pod: Obj) -> str:
    return str(at(pod, ("metadata", "name")))


def _uid(pod: Obj) -> str:
    return str(at(pod, ("metadata", "uid")) or "")


def _gone(now: str | None, uid: str) -> bool:
    """Whether a pod workload's pod (its uid when mirrored: `uid`, "" if not recorded) is
    gone, the pod now under its name having uid `now` (None: no pod)."""
    return now is None or (bool(uid) and now != uid)
