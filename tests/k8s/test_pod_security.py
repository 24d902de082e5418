"""Restricted Pod Security, on the fake and the real admission plugin (issue 22).

Gantry's project namespaces enforce the restricted standard; every pod Gantry renders must be
admitted there, and a hand-written privileged pod must not be: without that second half, a
namespace that enforced nothing would pass the first.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client

from scheduler.backends.base import PodRequest
from scheduler.backends.kubernetes.backend import PSS_LABELS
from scheduler.backends.kubernetes.render import render_pod, service_name
from tests.k8s.builders import make_request
from tests.k8s.conftest import PAUSE, Cluster
from tests.k8s.real_plane import drained, wait_for
from tests.k8s.test_render import VARIANTS as RENDERED

# Every shape kubernetes_render produces (tests/k8s/test_render.py), and an interactive job.
VARIANTS: dict[str, PodRequest] = {
    **RENDERED,
    "interactive": make_request(
        gpu_milli=1000, job_type="interactive", priority_class="high", max_runtime_s=None
    ),
}
PRIVILEGED = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "privileged"},
    "spec": {
        "automountServiceAccountToken": False,
        "containers": [{"name": "c", "image": PAUSE, "securityContext": {"privileged": True}}],
    },
}


@pytest.fixture
def project(cluster: Cluster) -> str:
    """A project namespace as the daemon creates it."""
    name = f"pss-{uuid.uuid4().hex[:8]}"
    cluster.backend.ensure_namespace(name)
    if cluster.real:  # admission refuses pods until the namespace's service account exists
        core: Any = client.CoreV1Api(cluster.backend.api_client)
        wait_for(core.list_namespaced_service_account, name, "default", lambda sa: bool(sa))
    return name


def read(fn: Any, *args: Any) -> Any:
    response = fn(*args, _preload_content=False)
    try:
        return json.loads(response.data)
    finally:
        response.release_conn()


def test_project_namespaces_enforce_the_restricted_standard(cluster: Cluster, project: str) -> None:
    labels = read(client.CoreV1Api(cluster.backend.api_client).read_namespace, project)["metadata"][
        "labels"
    ]
    assert {k: labels.get(k) for k in PSS_LABELS} == PSS_LABELS
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["app.kubernetes.io/managed-by"] == "gantry"


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_admission_accepts_every_pod_gantry_renders(
    cluster: Cluster, project: str, variant: PodRequest
) -> None:
    pod = replace(variant, namespace=project, node=cluster.nodes[0])
    cluster.backend.create_pod(pod)
    core = client.CoreV1Api(cluster.backend.api_client)
    created = read(core.read_namespaced_pod, pod.name, project)
    assert created["spec"]["schedulerName"] == "gantry"
    if pod.replicas > 1 and pod.replica == 0:
        service = read(core.read_namespaced_service, service_name(pod.job_id, pod.attempt), project)
        assert service["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_rendered_pods_draw_no_pod_security_warning(
    cluster: Cluster, project: str, variant: PodRequest
) -> None:
    """The namespaces also warn and audit at restricted: an admitted pod that still drew a
    warning (a field the standard frowns on) would show in every `kubectl` output."""
    manifest = render_pod(
        replace(variant, namespace=project, node=cluster.nodes[0]), cluster.backend.config
    )
    core: Any = client.CoreV1Api(cluster.backend.api_client)
    response = core.create_namespaced_pod(project, manifest, _preload_content=False)
    warnings = response.headers.get("Warning")
    drained(response)
    assert response.status == 201 and not warnings


def test_admission_refuses_a_privileged_pod_in_the_same_namespace(
    cluster: Cluster, project: str
) -> None:
    core: Any = client.CoreV1Api(cluster.backend.api_client)
    with pytest.raises(client.ApiException) as raised:
        core.create_namespaced_pod(project, PRIVILEGED, _preload_content=False)
    assert raised.value.status == 403
    message = json.loads(raised.value.body)["message"]
    assert message.startswith(
        'pods "privileged" is forbidden: violates PodSecurity "restricted:latest": '
    )
    # Found on the real server: its wording, which the fake now copies.
    assert 'privileged (container "c" must not set securityContext.privileged=true)' in message
    drop = 'unrestricted capabilities (container "c" must set securityContext.capabilities.drop'
    assert drop + '=["ALL"])' in message
