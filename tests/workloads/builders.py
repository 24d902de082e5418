"""Small builders of the workload kinds and of the AdmissionReviews that carry them."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import jsonpatch

from scheduler.workloads.kinds import Kind

Obj = dict[str, Any]
PAUSE = "registry.k8s.io/pause:3.10"


def pod_spec(name: str = "main") -> Obj:
    return {"restartPolicy": "Never", "containers": [{"name": name, "image": PAUSE}]}


def template() -> Obj:
    return {"spec": pod_spec()}


def job_template() -> Obj:
    return {"spec": {"template": template()}}


def obj(kind: Kind, name: str, spec: Obj, **metadata: Any) -> Obj:
    api_version = f"{kind.group}/{kind.version}" if kind.group else kind.version
    return {
        "apiVersion": api_version,
        "kind": kind.kind,
        "metadata": {"name": name, "namespace": "team-a", **metadata},
        "spec": spec,
    }


def review(kind: Kind, body: Any, *, user: str | None = "alice", operation: str = "CREATE") -> Obj:
    request: Obj = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
        "resource": {"group": kind.group, "version": kind.version, "resource": kind.plural},
        "namespace": "team-a",
        "operation": operation,
        "userInfo": {"username": user, "groups": ["system:authenticated"]} if user else {},
        "object": body,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def ops_of(answer: Obj) -> list[Obj]:
    """The response's JSONPatch operations ([] without a patch)."""
    response = answer["response"]
    if "patch" not in response:
        assert "patchType" not in response
        return []
    assert response["patchType"] == "JSONPatch"
    ops: list[Obj] = json.loads(base64.b64decode(response["patch"]))
    return ops


def applied(answer: Obj, body: Obj) -> Obj:
    """The object as the API server stores it: the patch applied as RFC 6902 says."""
    patched: Obj = jsonpatch.apply_patch(body, ops_of(answer))
    return patched
