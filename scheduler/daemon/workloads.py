"""Reconcile's part for Jobs users created in Kubernetes (issue 37, docs/kubernetes-native.md).

Gantry admits such a Job by labelling its pod template with the job (once: a Job's template
cannot change after it has run, so the label names no attempt) and unsuspending it
(`KubernetesBackend.admit_workload`, in the cycle's bind phase); the Job's controller then
makes the pods, with names of its own. Until it has, each replica's allocation holds a
stand-in name (`pod_name(job, attempt, replica)`, the name Gantry would have given). At each
reconcile:

1. adopt: a pod of an admitted attempt that no allocation names takes the stand-in of a
   replica still waiting for one (its completion index's replica where it has one), and is
   bound to that replica's node; a replica's pod still unbound is bound again;
2. wait: a stand-in not adopted yet is judged as a pod Pending on no node (so the binding
   deadline applies, with the reason "its Job has not made the pod yet"), not as a pod gone,
   while its job is placed (admitted, binding, running); once the job has ended or was
   preempted (its object failed with no pod, it was cancelled), it is a pod gone, and its
   allocation is released;
3. suspend: a Job whose job stopped in Gantry otherwise than by succeeding (preempted,
   cancelled, failed, requeued) is suspended again, before its pods are deleted: its
   controller then deletes its pods and makes none until admitted again (and a sweep,
   `scheduler.daemon.strays`, suspends one that runs while its job is not live, whatever
   left it so).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from scheduler.backends.base import BackendError, PodPhase, PodStatus, pod_name
from scheduler.backends.workloads import workload_ref
from scheduler.daemon.cluster import Cluster
from scheduler.leader import Lease
from scheduler.models import Allocation, Job, JobState

log = logging.getLogger("gantry.daemon")
Row = Mapping[str, Any]
WAITING = "its Job has not made the pod yet"
# A job in these states keeps its Job unsuspended (an older attempt's allocations stopping
# beside a newer one's must not suspend it again).
LIVE = frozenset({JobState.ADMITTED, JobState.BINDING, JobState.RUNNING, JobState.SUCCEEDED})
# A job in these states waits for its object's controller to make the pods of its replicas;
# in any other, a replica with no pod has none to wait for (its allocation is released).
PLACING = frozenset({JobState.ADMITTED, JobState.BINDING, JobState.RUNNING})


def workload_of(row: Row) -> str:
    """ "<plural>/<name>" for the job of an object a user created that Gantry resumes (a
    Job, JobSet, RayJob, TrainJob); "" for any other."""
    return workload_ref(row.get("spec__workload"))


def _stand_in(a: Row) -> str:
    return pod_name(a["job_id"], a["attempt"], a["replica"])


def adopt(
    allocs: Sequence[dict[str, Any]],
    jobs: Mapping[int, Row],
    pods: dict[str, PodStatus],
    cluster: Cluster,
    lease: Lease,
) -> list[dict[str, Any]]:
    """Steps 1 and 2: `allocs` with the adopted pods' names (new dicts: the given ones are
    the cache's), the adoptions written; `pods` gains a Pending stand-in for each replica
    still waiting."""
    waiting: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for a in allocs:
        job = jobs.get(a["job_id"])
        if job is None or not workload_of(job) or a["end_reason"] or a["attempt"] != job["attempt"]:
            continue
        if job["state"] not in PLACING:
            continue  # ended meanwhile (its object failed, it was cancelled): no pod will come
        if a["pod_name"] == _stand_in(a):
            waiting[a["job_id"]].append(a)
    if not waiting:
        _bind_unbound(allocs, jobs, pods, cluster)  # a bind that failed (or died) before
        return list(allocs)
    named = {a["pod_name"] for a in allocs}
    current = {job_id: slots[0]["attempt"] for job_id, slots in waiting.items()}
    adopted: dict[int, str] = {}
    strays = sorted(
        (
            p
            for p in pods.values()
            if p.name not in named
            and p.job_id in waiting
            # A Job's pods name no attempt: the one waiting now is theirs (the last one's
            # pods were gone, or going, before its job was requeued).
            and p.attempt in (-1, current[p.job_id])
            and not p.deleting
            and not p.companion  # a submitter, an initializer: no replica (companions.py)
        ),
        key=lambda p: p.name,
    )
    for pod in strays:
        slots = waiting[pod.job_id]
        slot = next((a for a in slots if a["replica"] == pod.replica), slots[0] if slots else None)
        if slot is None:
            continue  # more pods than replicas: an orphan, deleted as any other
        slots.remove(slot)
        adopted[slot["id"]] = pod.name
    if adopted:
        with lease.writing():
            for alloc_id, name in adopted.items():
                Allocation.objects.filter(id=alloc_id, ended_at__isnull=True).update(pod_name=name)
        log.info("adopted %d pods of Jobs made in Kubernetes", len(adopted))
    out = [{**a, "pod_name": adopted[a["id"]]} if a["id"] in adopted else a for a in allocs]
    for slots in waiting.values():
        for a in slots:
            pods[a["pod_name"]] = PodStatus(
                a["pod_name"],
                a["namespace"],
                a["job_id"],
                a["attempt"],
                a["replica"],
                None,
                PodPhase.PENDING,
                waiting=WAITING,
            )
    _bind_unbound(out, jobs, pods, cluster)
    return out


def _bind_unbound(
    allocs: Iterable[Row], jobs: Mapping[int, Row], pods: dict[str, PodStatus], cluster: Cluster
) -> None:
    """Bind each adopted pod still on no node to its replica's node (a bind that failed is
    tried again at the next reconcile). `pods` shows each bound on its node: the judge that
    follows must not bind it again (a claim left admitted by a dead daemon is adopted there)."""
    binds = []
    for a in allocs:
        job = jobs.get(a["job_id"])
        pod = pods.get(a["pod_name"])
        if job is None or pod is None or pod.node is not None or pod.waiting == WAITING:
            continue
        if not workload_of(job) or pod.deleting or pod.phase != PodPhase.PENDING:
            continue
        binds.append((a["namespace"], a["pod_name"], a["node__name"]))
    failed = cluster.bind_pods(binds)  # concurrently, as the bind phase's calls
    for bind in binds:
        _, name, node = bind
        if (error := failed.get(bind)) is not None:
            log.warning("binding pod %s of a Job failed: %s", name, error)
        else:
            pods[name] = replace(pods[name], node=node)


def suspend_stopped(
    stopping: Iterable[Row], jobs: Mapping[int, Row], cluster: Cluster, *, ended: bool = False
) -> None:
    """Step 3, for the jobs of the allocations `stopping`, once each (`ended`: their jobs
    failed in this reconcile, and their rows still say what they were): their objects
    suspended concurrently, none this daemon suspended already (`Cluster.suspend_workloads`)."""
    objects: dict[tuple[str, str], None] = {}
    for a in stopping:
        job = jobs.get(a["job_id"])
        if job is None or not (workload := workload_of(job)):
            continue
        if not ended and job["state"] in LIVE:
            continue  # its Job completes on its own, or runs again under a newer attempt
        objects[(a["namespace"], workload)] = None
    cluster.suspend_workloads(objects)


def suspend_workload(cluster: Cluster, namespace: str, workload: str) -> None:
    """Suspend the object `workload` names ("jobs/<name>", "jobsets/<name>"), fenced, even one
    this daemon suspended before (the strays' sweep: something left it running); a failure is
    logged (reconcile suspends a stopped job's object again at its next pass)."""

    def suspend() -> None:
        backend: Any = cluster.backend  # the Kubernetes backend: only it has such jobs
        backend.suspend_workload(namespace, workload)

    try:
        cluster.call(suspend)
    except BackendError as error:
        log.warning("suspending %s failed (tried again next cycle): %s", workload, error)


def left_to_their_jobs(pods: Sequence[PodStatus]) -> set[str]:
    """The names of `pods` (which no allocation holds) left to their objects' controllers:
    those a user's batch/v1 Job made for a job that did not succeed (its controller deletes
    them once the Job is suspended, and one Gantry deleted would count as a failed pod
    against the Job's backoffLimit: at 0, the Job fails with no pod while its job waits to
    be bound again; a pod made as the Job was being suspended, after its job's allocation
    ended, is one), and any user's object's pod that has ended (`keeps_pods`)."""
    ids = {p.job_id for p in pods if p.job_id}
    if not ids:
        return set()
    rows = Job.objects.filter(pk__in=ids).values("id", "state", "spec__workload")
    theirs = {r["id"]: r for r in rows if workload_of(r)}
    return {
        p.name
        for p in pods
        if (row := theirs.get(p.job_id)) is not None
        and keeps_pods(row, p)
        and (pod_ended(p) or workload_of(row).startswith("jobs/"))
    }


def keeps_pods(row: Row, pod: PodStatus | None = None) -> bool:
    """Whether a stopping job's pod is left to its object's controller: every pod of a user's
    object whose job did not succeed (suspended, its controller deletes them; one Gantry
    deleted would count against a Job's backoffLimit), and a pod of a user's object that has
    ended, whatever its job's state (it holds no device, and its logs are the user's: `kubectl
    logs` reads them until the object's own controller or TTL removes it). A pod still running
    for a job that succeeded (a RayJob's cluster kept up) is Gantry's to delete."""
    if not workload_of(row):
        return False
    return (pod is not None and pod_ended(pod)) or row["state"] != JobState.SUCCEEDED


def pod_ended(pod: PodStatus) -> bool:
    return pod.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)
