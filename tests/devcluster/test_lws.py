"""LeaderWorkerSet's controller manager beside the real plane (devcluster/controllers.py, a peer
built with `python -m devcluster build --peers`): a LeaderWorkerSet created in the plane makes
its leaders' StatefulSet, owned by it, whose pods its release's Pod webhook labels (issue 37)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from kubernetes import client

from devcluster import controllers
from devcluster.versions import binary
from tests.k8s.real_plane import RealPlane, drained, wait_for

pytestmark = pytest.mark.kubernetes


def test_a_leaderworkerset_makes_its_leaders_statefulset(real_plane: RealPlane) -> None:
    if real_plane.plane is None:
        pytest.skip("KUBECONFIG's cluster: LWS's manager runs beside devcluster's plane")
    if not binary("lws").is_file():
        pytest.skip("LeaderWorkerSet's manager is not built (python -m devcluster build --peers)")
    api = real_plane.api
    core: Any = client.CoreV1Api(api)
    namespace = f"lws-{uuid.uuid4().hex[:8]}"
    drained(core.create_namespace({"metadata": {"name": namespace}}, _preload_content=False))
    wait_for(core.list_namespaced_service_account, namespace, "default", lambda a: a is not None)
    pod = {"spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}
    body = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "serve"},
        "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "workerTemplate": pod}},
    }
    objects: Any = client.CustomObjectsApi(api)
    apps: Any = client.AppsV1Api(api)
    try:
        with controllers.running(real_plane.plane, api, "LeaderWorkerSet"):
            response = objects.create_namespaced_custom_object(
                "leaderworkerset.x-k8s.io",
                "v1",
                namespace,
                "leaderworkersets",
                body,
                _preload_content=False,
            )
            json.loads(response.data)
            response.release_conn()
            leaders = wait_for(
                apps.list_namespaced_stateful_set, namespace, "serve", lambda s: s is not None
            )
            assert leaders is not None
            (owner,) = leaders["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"]) == ("LeaderWorkerSet", "serve")
            leader = wait_for(
                core.list_namespaced_pod, namespace, "serve-0", lambda p: p is not None
            )
            assert leader is not None
            # Labelled by the release's Pod webhook (the worker index of a leader is 0).
            labels = leader["metadata"]["labels"]
            assert labels["leaderworkerset.sigs.k8s.io/name"] == "serve"
            assert labels["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    finally:
        drained(core.delete_namespace(namespace, _preload_content=False))
