"""Gantry's status on the objects users create (issue 37): what `kubectl get` can show.

Events say each change once, and `kubectl describe` lists them; but `kubectl get` shows an
object's status, which its own controller writes (a Job's conditions are the job controller's,
a JobSet's the JobSet controller's), and a second writer there would fight it or be refused.
Kueue writes its state on an object of its own (a Workload). Gantry keeps two annotations on
the object itself, current with its job, written by the workload controller with the event of
each change:

- `gantry.io/status`: one word, the event's reason (`Queued`, `WaitingForApproval`,
  `Admitted`, `Running`, `Preempted`, `Succeeded`, `Failed`, `Cancelled`, `Refused`);
- `gantry.io/reason`: the event's message (why it waits, its place in the team's queue and
  its estimated start, why it was preempted or refused).

Annotations are metadata: no kind's controller reads or rewrites Gantry's, and every kind has
them; `kubectl get -o custom-columns` shows them (docs/kubernetes-native.md). The controller's
account may change nothing else on the object (ValidatingAdmissionPolicy
`gantry-workloads-status`, platform/k8s/26-workload-status.yaml).
"""

from __future__ import annotations

ANNOTATION_STATUS = "gantry.io/status"
ANNOTATION_REASON = "gantry.io/reason"
# What `kubectl get` shows in one line; the whole message is in the event.
REASON_MAX = 1024


def status_annotations(status: str, reason: str) -> dict[str, str]:
    """The annotations for `status` (an event's reason) and `reason` (its message)."""
    return {ANNOTATION_STATUS: status, ANNOTATION_REASON: reason[:REASON_MAX]}
