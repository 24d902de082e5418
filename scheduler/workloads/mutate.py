"""The admission webhook's decision: an AdmissionReview in, its response out (issue 37).

A pure function of the review: no database, no client, no clock, so that it answers within the
API server's timeout whatever Gantry's database is doing, and the same review always gets the
same patch. It refuses nothing: every response is `allowed`, with a JSONPatch when the object
is one Gantry holds (docs/kubernetes-native.md, "Admission"):
- a workload of a kind in `kinds.WORKLOADS` created by a user: suspended (where the kind has a
  suspend flag), Gantry's schedulerName on every pod template, the annotation naming the
  creating user and the managed label; a RayJob in K8sJobMode without a submitter template
  gets KubeRay's default one, written out (`companions.default_submitter_template`), so that
  Gantry can label the submitter pod's template when it admits the RayJob;
- a Pod created by a user (single, or one of a pod group by label): the scheduling gate,
  schedulerName, the annotation and the label;
- a LeaderWorkerSet's pod, owned by a StatefulSet the set made: gated like a user's pod (its
  annotation names the StatefulSet controller that created it; the set's own names the user,
  and the label `leaderworkerset.sigs.k8s.io/name` leads from the pod to its set);
- an object whose controller is of a held kind (a Job's pod, a JobSet's Job, a TrainJob's
  JobSet): schedulerName only; its owner is what is held.
Anything else (another kind, an update, an object from an exempt user such as Gantry's own
daemon) passes unchanged, and so does a review that cannot be read: the response is allowed
with no patch, never an error.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

from scheduler.workloads.companions import default_submitter_template
from scheduler.workloads.kinds import OWNED_THROUGH, POD, RAYJOB, Kind, Path, at, find, group_of

Obj = dict[str, Any]
Op = dict[str, Any]

SCHEDULER_NAME = "gantry"
GATE = "gantry.io/admission"
ANNOTATION_SUBMITTED_BY = "gantry.io/submitted-by"
LABEL_MANAGED = "gantry.io/managed"
LABEL_POD_GROUP = "gantry.io/pod-group"
LABEL_POD_GROUP_SIZE = "gantry.io/pod-group-size"
REVIEW_VERSION = "admission.k8s.io/v1"


def review_response(
    review: Any,
    *,
    scheduler_name: str = SCHEDULER_NAME,
    exempt_users: Iterable[str] = (),
) -> Obj:
    """The AdmissionReview to answer `review` with. `exempt_users` are the usernames whose
    creates pass unchanged (Gantry's own daemon, whose pods are already placed)."""
    request = review.get("request") if isinstance(review, dict) else None
    if not isinstance(request, dict):
        return _answer("", [])
    uid = request.get("uid")
    if not isinstance(uid, str):
        return _answer("", [])
    return _answer(uid, _ops(request, scheduler_name, frozenset(exempt_users)))


def _ops(request: Obj, scheduler_name: str, exempt: frozenset[str]) -> list[Op]:
    requested = request.get("kind")
    obj = request.get("object")
    if request.get("operation") != "CREATE" or not isinstance(requested, dict):
        return []
    kind = find(str(requested.get("group", "")), str(requested.get("kind", "")))
    if kind is None or not isinstance(obj, dict):
        return []
    user_info = request.get("userInfo")
    username = user_info.get("username") if isinstance(user_info, dict) else None
    if not isinstance(username, str):
        username = None
    elif username in exempt:
        return []
    return plan(kind, obj, username, scheduler_name)


def plan(
    kind: Kind, obj: Obj, username: str | None, scheduler_name: str = SCHEDULER_NAME
) -> list[Op]:
    """The patch for a new object of a known kind, created by `username` (None: the review
    named nobody, so no user's claim survives: the annotation is removed)."""
    names = [
        op
        for path in kind.pod_specs(obj)
        for op in _set(obj, (*path, "schedulerName"), scheduler_name)
    ]
    if _controller_group_kind(obj) in OWNED_THROUGH:
        return names
    if kind is POD:
        hold = _gate(obj)
    else:
        hold = _set(obj, kind.suspend, True) if kind.suspend is not None else []
    managed = _set(obj, ("metadata", "labels", LABEL_MANAGED), "true")
    submitter = default_submitter_template(obj, scheduler_name) if kind is RAYJOB else None
    written = _set(obj, ("spec", "submitterPodTemplate"), submitter) if submitter else []
    return [*hold, *names, *written, *_submitted_by(obj, username), *managed]


def _controller_group_kind(obj: Obj) -> tuple[str, str] | None:
    owners = at(obj, ("metadata", "ownerReferences"))
    for owner in owners if isinstance(owners, list) else ():
        if isinstance(owner, dict) and owner.get("controller") is True:
            return (group_of(str(owner.get("apiVersion", ""))), str(owner.get("kind", "")))
    return None


def _submitted_by(obj: Obj, username: str | None) -> list[Op]:
    path = ("metadata", "annotations", ANNOTATION_SUBMITTED_BY)
    if username is not None:
        return _set(obj, path, username)
    annotations = at(obj, ("metadata", "annotations"))
    if isinstance(annotations, dict) and ANNOTATION_SUBMITTED_BY in annotations:
        return [{"op": "remove", "path": _pointer(path)}]
    return []


def _gate(pod: Obj) -> list[Op]:
    gates = at(pod, ("spec", "schedulingGates"))
    if isinstance(gates, list):
        if any(isinstance(g, dict) and g.get("name") == GATE for g in gates):
            return []
        return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}}]
    return _set(pod, ("spec", "schedulingGates"), [{"name": GATE}])


def _set(obj: Obj, path: Path, value: Any) -> list[Op]:
    """The one `add` that makes `obj` hold `value` at `path`: at the first missing (or null)
    step, the rest of the path as nested objects. Nothing where a step on the way is not an
    object (the API server refuses such an object on its own)."""
    here: Any = obj
    for depth, step in enumerate(path[:-1]):
        if isinstance(step, int):
            here = here[step]  # list items come from the kinds' own paths: present
            continue
        if here.get(step) is None:  # absent, or null (which the API server reads as absent)
            for missing in reversed(path[depth + 1 :]):
                value = {missing: value}
            return [{"op": "add", "path": _pointer(path[: depth + 1]), "value": value}]
        here = here[step]
        if not isinstance(here, dict) and not isinstance(path[depth + 1], int):
            return []
    return [{"op": "add", "path": _pointer(path), "value": value}]


def _pointer(path: Path) -> str:
    """RFC 6901: `~` is `~0` and `/` is `~1` inside a step."""
    return "".join("/" + str(step).replace("~", "~0").replace("/", "~1") for step in path)


def _answer(uid: str, ops: list[Op]) -> Obj:
    response: Obj = {"uid": uid, "allowed": True}
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return {"apiVersion": REVIEW_VERSION, "kind": "AdmissionReview", "response": response}
