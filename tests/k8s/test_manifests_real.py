"""platform/k8s/ applied to a real API server (issue 22).

The offline checks (tests/test_platform.py: kubernetes_validate's schemas) cannot see what only
the server decides: defaulting and validation of the objects as stored, admission (the
PriorityClass and ServiceAccount a pod names, Pod Security of the namespace), and warnings.
Here every document is applied server-side as `kubectl apply --server-side` would, with
fieldValidation=Strict, and must be accepted without a warning; the pod of every workload is
then created (dry run) in its namespace so that Pod Security `restricted` judges it. Two
counter-tests show that those checks refuse what they should, so their passing means something.

The workloads are removed again afterwards: nothing runs them (no kube-scheduler places their
pods), and the session's plane is shared with the other real-cluster tests.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from tests.k8s.real_api import (
    FIELD_MANAGER,
    Answer,
    Manifest,
    Paths,
    apply,
    create_pod,
    manifests,
    request,
)
from tests.k8s.real_plane import RealPlane

pytestmark = pytest.mark.kubernetes

MANIFESTS = manifests()
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob")
WORKLOADS = [m for m in MANIFESTS if m.doc["kind"] in WORKLOAD_KINDS]
# Left in place: the other real-cluster tests use the namespace, the priority classes and the
# accounts; the rest of what the platform creates is removed at the end.
KEPT_KINDS = {"Namespace", "PriorityClass", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}


def _pod_of(manifest: Manifest) -> dict[str, Any]:
    """The pod a workload's controller would create from its template."""
    doc = manifest.doc
    spec = doc["spec"]["jobTemplate"]["spec"] if doc["kind"] == "CronJob" else doc["spec"]
    template = copy.deepcopy(spec["template"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template.get("metadata", {}), "name": f"{doc['metadata']['name']}-probe"},
        "spec": template["spec"],
    }


@pytest.fixture(scope="module")
def applied(real_plane: RealPlane) -> Iterator[dict[str, Answer]]:
    """Every manifest applied once, in file order; the server's answer to each by id."""
    api = real_plane.api
    paths = Paths(api)
    answers = {m.id: apply(api, paths, m.doc) for m in MANIFESTS}
    yield answers
    for manifest in reversed(MANIFESTS):
        doc = manifest.doc
        if doc["kind"] in KEPT_KINDS and doc["metadata"]["name"] != "team-a-vision":
            continue
        request(api, "DELETE", paths.of(doc), query=[("propagationPolicy", "Background")])


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda m: m.id)
def test_the_api_server_accepts_every_manifest_without_a_warning(
    applied: dict[str, Answer], manifest: Manifest
) -> None:
    answer = applied[manifest.id]
    assert answer.status in (200, 201), f"{manifest.id}: {answer.status} {answer.message}"
    assert not answer.warnings, f"{manifest.id} drew warnings: {answer.warnings}"


def _our_write(body: dict[str, Any]) -> tuple[Any, ...]:
    """What a rewrite by our apply changes. Where the object has a generation, that and the
    fields we own: not the resourceVersion, which the controllers move on every status update,
    nor our managed fields' time, which the server refreshes on the first apply after another
    manager wrote the status (a ValidatingAdmissionPolicy's type checking) though nothing of
    ours changed. Objects without a generation nobody else writes: their resourceVersion."""
    meta = body["metadata"]
    if "generation" not in meta:
        return ("resourceVersion", meta["resourceVersion"])
    ours = [
        m.get("fieldsV1")
        for m in meta.get("managedFields", ())
        if m.get("manager") == FIELD_MANAGER
    ]
    return (meta["generation"], ours)


def test_applying_the_manifests_twice_changes_nothing(
    real_plane: RealPlane, applied: dict[str, Answer]
) -> None:
    """`kubectl apply` again (an upgrade with nothing new) must not rewrite any object: a field
    the server normalises differently from the manifest would be written back every time."""
    paths = Paths(real_plane.api)
    changed = []
    for manifest in MANIFESTS:
        again = apply(real_plane.api, paths, manifest.doc)
        assert again.status == 200, f"{manifest.id}: {again.status} {again.message}"
        if _our_write(again.body) != _our_write(applied[manifest.id].body):
            changed.append(manifest.id)
    assert not changed, f"a second apply rewrote {changed}"


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda m: m.id)
def test_pod_security_admits_the_pod_of_every_workload(
    real_plane: RealPlane, applied: dict[str, Answer], workload: Manifest
) -> None:
    """The namespace enforces `restricted`: the pod each controller would create is admitted
    (PriorityClass, ServiceAccount and Pod Security admission all run on a dry-run create)."""
    assert workload.namespace is not None
    answer = create_pod(real_plane.api, workload.namespace, _pod_of(workload))
    assert answer.status == 201, f"{workload.id}: {answer.status} {answer.message}"
    assert not answer.warnings, f"{workload.id} drew warnings: {answer.warnings}"


def test_pod_security_refuses_a_privileged_pod_in_the_platform_namespace(
    real_plane: RealPlane, applied: dict[str, Answer]
) -> None:
    """The counter-test: the same pod made privileged is refused by Pod Security admission,
    so the admissions above are the namespace's `restricted` level judging, not a lax server."""
    web = next(m for m in WORKLOADS if m.doc["metadata"]["name"] == "gantry-web")
    pod = _pod_of(web)
    context = pod["spec"]["containers"][0]["securityContext"]
    context["privileged"] = context["allowPrivilegeEscalation"] = True  # valid, not restricted
    assert web.namespace is not None
    answer = create_pod(real_plane.api, web.namespace, pod)
    assert answer.status == 403, answer
    assert 'violates PodSecurity "restricted:latest"' in answer.message, answer.message
    assert "privileged" in answer.message


def test_strict_field_validation_refuses_a_misspelt_field(
    real_plane: RealPlane, applied: dict[str, Answer]
) -> None:
    """The counter-test of Strict: a misspelt field is an error, not silently dropped."""
    deployment = copy.deepcopy(next(m for m in WORKLOADS if m.doc["kind"] == "Deployment").doc)
    deployment["spec"]["replcas"] = 2
    answer = apply(real_plane.api, Paths(real_plane.api), deployment, dry_run=True)
    assert answer.status >= 400, answer
    assert ".spec.replcas: field not declared in schema" in answer.message, answer.message
