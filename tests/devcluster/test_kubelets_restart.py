"""The simulated kubelets outlive an API server restart, as real kubelets do."""

from __future__ import annotations

import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.k8s.real_plane import WAIT_S, RealPlane, drained, wait_for_pod

pytestmark = pytest.mark.kubernetes


def test_kubelets_keep_running_pods_after_an_apiserver_restart(real_plane: RealPlane) -> None:
    """Their thread died on the first refused connection: every later pod stayed Pending."""
    if real_plane.plane is None or real_plane.kubelets is None:
        pytest.skip("KUBECONFIG's cluster: not ours to restart")
    real_plane.plane.restart_apiserver()  # the kubelets' passes meanwhile are refused
    assert real_plane.kubelets.wait_passes(2, WAIT_S)

    core = client.CoreV1Api(real_plane.api)
    # An existing namespace: a new one has no service account until the controller manager,
    # itself reconnecting after the restart, makes it, and admission refuses pods until then.
    namespace = "default"
    pod = {
        "metadata": {"name": "after-restart"},
        "spec": {
            "nodeName": real_plane.cpu_nodes[0],
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    # The API server's own cache of service accounts fills again after its restart: until then
    # admission refuses pods even in `default` ("error looking up service account").
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            drained(core.create_namespaced_pod(namespace, pod, _preload_content=False))
            break
        except ApiException as refused:
            if refused.status != 403 or "service account" not in str(refused.body):
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    running = wait_for_pod(
        real_plane.api, namespace, "after-restart", lambda p: _phase(p) == "Running"
    )
    assert running is not None
    drained(core.delete_namespaced_pod("after-restart", namespace, _preload_content=False))


def _phase(pod: dict[str, object] | None) -> object:
    status = (pod or {}).get("status")
    return status.get("phase") if isinstance(status, dict) else None
