"""Reconcile's part for the pods an operator makes beside a job's replicas (issue 37,
docs/kubernetes-native.md): a RayJob's submitter (the pod of the Job KubeRay makes to run
`ray job submit`), a TrainJob's initializers. Their CPU and memory were reserved with replica
0 (`scheduler.workloads.companions`), so they go to replica 0's node; and the pods of an
object's parts without GPUs beside parts with GPUs (a RayJob's CPU head, a PyTorchJob's CPU
Master, a JobSet's driver: `scheduler.backends.companions`).

Gantry's admission labels their templates (`gantry.io/companion`, with the job and, for a
RayJob and a TrainJob's initializers, the attempt: `scheduler.backends.kubernetes.resume`),
and the webhook names Gantry their scheduler, so nothing else binds them. At each reconcile,
a companion pod is:
- kept and, while unbound, bound to replica 0's node, when its job is admitted (admitted,
  binding or running) under the attempt the pod names (a JobSet's driver and a PyTorchJob's
  Master name none: their templates are labelled once), and that attempt's replica 0 holds a
  live allocation;
- kept (and not bound: it is already), when its job succeeded and it still runs (a
  PyTorchJob's Master or a JobSet's driver without GPUs finishing after the GPU replicas):
  it ends on its own, and deleted it would fail the object that Gantry's job succeeded for;
- otherwise an orphan, deleted as any other pod no allocation names: the pod of a stopped
  attempt (its operator deletes it too, once the object is suspended), never bound again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from scheduler.backends.base import PodPhase, PodStatus
from scheduler.daemon.cluster import Cluster
from scheduler.models import Job, JobState

log = logging.getLogger("gantry.daemon")
Row = Mapping[str, Any]
# A job in these states holds its replica 0's node for its companions.
ADMITTED = frozenset({JobState.ADMITTED, JobState.BINDING, JobState.RUNNING})


def keep_companions(
    allocs: Sequence[Row], jobs: Mapping[int, Row], pods: dict[str, PodStatus], cluster: Cluster
) -> set[str]:
    """The names of the companion pods to keep (not orphans); each of them still unbound is
    bound to its replica 0's node (a bind that fails is tried again at the next reconcile),
    and `pods` shows it there."""
    heads = {
        (a["job_id"], a["attempt"]): a["node__name"]
        for a in allocs
        if a["replica"] == 0 and not a["end_reason"] and a["node__name"]
    }
    kept: set[str] = set()
    binds: list[tuple[str, str, str]] = []
    succeeded = _succeeded({p.job_id for p in pods.values() if p.companion and p.node})
    for pod in [p for p in pods.values() if p.companion]:
        if _finishing(pod, succeeded):
            kept.add(pod.name)
            continue
        job = jobs.get(pod.job_id)
        if job is None or job["state"] not in ADMITTED or pod.attempt not in (-1, job["attempt"]):
            continue
        node = heads.get((pod.job_id, job["attempt"]))
        if node is None:
            continue
        kept.add(pod.name)
        if pod.node is not None or pod.deleting or pod.phase != PodPhase.PENDING:
            continue
        binds.append((pod.namespace, pod.name, node))
    failed = cluster.bind_pods(binds)  # concurrently where the backend allows it
    for bind in binds:
        _, name, node = bind
        if (error := failed.get(bind)) is not None:
            log.warning("binding %s pod %s failed: %s", pods[name].companion, name, error)
        else:
            pods[name] = replace(pods[name], node=node)
    return kept


def _succeeded(ids: set[int]) -> set[int]:
    """Which of the jobs `ids` succeeded (jobs that ended are not among reconcile's rows)."""
    if not ids:
        return set()
    return set(
        Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED).values_list("pk", flat=True)
    )


def _finishing(pod: PodStatus, succeeded: set[int]) -> bool:
    """A companion bound, not yet ended, of a job that succeeded: left to end on its own."""
    running = pod.phase in (PodPhase.PENDING, PodPhase.RUNNING) and not pod.deleting
    return pod.job_id in succeeded and pod.node is not None and running
