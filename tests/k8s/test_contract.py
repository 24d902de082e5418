"""The backend's contract, against the fake apiserver and, with KUBECONFIG set, a real cluster.

Each test uses only what both offer: the backend itself and a way to wait until a deleted pod
is really gone (the fake plays the kubelet; a real cluster is polled). Pods are CPU-only
`pause` containers so that the suite runs on any cluster, GPU or not.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client

from scheduler.backends.base import (
    BindConflict,
    ClusterBackend,
    PodPhase,
    PodRequest,
    PodStatus,
)
from tests.k8s.builders import make_request
from tests.k8s.conftest import Cluster

PAUSE = "registry.k8s.io/pause:3.10"


def request_for(cluster: Cluster, job_id: int, **changes: Any) -> PodRequest:
    base = make_request(
        job_id,
        namespace=cluster.namespace,
        node=cluster.nodes[0],
        gpu_milli=0,
        cpu_milli=10,
        memory_mib=16,
        image=PAUSE,
        command=(),
        grace_period_s=5,
    )
    return replace(base, **changes)


def raw(fn: Any, *args: Any) -> Any:
    """A read as plain JSON (what the apiserver sent, no client models)."""
    response = fn(*args, _preload_content=False)
    try:
        return json.loads(response.data)
    finally:
        response.release_conn()


def ours(cluster: Cluster, name: str) -> list[PodStatus]:
    return [
        p
        for p in cluster.backend.list_pods()
        if p.namespace == cluster.namespace and p.name == name
    ]


def test_backend_satisfies_the_protocol(cluster: Cluster) -> None:
    assert isinstance(cluster.backend, ClusterBackend)


def test_list_nodes(cluster: Cluster) -> None:
    nodes = {n.name: n for n in cluster.backend.list_nodes()}
    assert set(cluster.nodes) <= set(nodes)
    assert all(nodes[name].cpu_milli > 0 and nodes[name].ready for name in cluster.nodes)


def test_create_is_idempotent_and_listed_unbound(cluster: Cluster) -> None:
    pod = request_for(cluster, 101)
    cluster.backend.create_pod(pod)
    cluster.backend.create_pod(pod)  # a retry adopts, no second pod
    (status,) = ours(cluster, "gantry-101-a0-r0")
    assert (status.job_id, status.attempt, status.replica) == (101, 0, 0)
    assert status.node is None and status.phase == PodPhase.PENDING and not status.deleting


def test_bind_is_idempotent_on_the_same_node(cluster: Cluster) -> None:
    cluster.backend.create_pod(request_for(cluster, 102))
    cluster.backend.bind_pod(cluster.namespace, "gantry-102-a0-r0", cluster.nodes[0])
    cluster.backend.bind_pod(cluster.namespace, "gantry-102-a0-r0", cluster.nodes[0])
    (status,) = ours(cluster, "gantry-102-a0-r0")
    assert status.node == cluster.nodes[0]


def test_bind_to_another_node_is_a_conflict_naming_the_winner(cluster: Cluster) -> None:
    cluster.backend.create_pod(request_for(cluster, 103))
    cluster.backend.bind_pod(cluster.namespace, "gantry-103-a0-r0", cluster.nodes[0])
    with pytest.raises(BindConflict) as raised:
        cluster.backend.bind_pod(cluster.namespace, "gantry-103-a0-r0", "some-other-node")
    assert raised.value.bound_node == cluster.nodes[0] and not raised.value.deleting


def test_bind_of_a_missing_pod_is_a_conflict_to_requeue(cluster: Cluster) -> None:
    with pytest.raises(BindConflict) as raised:
        cluster.backend.bind_pod(cluster.namespace, "gantry-104-a0-r0", cluster.nodes[0])
    assert raised.value.deleting


def test_graceful_delete_then_gone_and_repeat_delete_is_success(cluster: Cluster) -> None:
    cluster.backend.create_pod(request_for(cluster, 105))
    cluster.backend.bind_pod(cluster.namespace, "gantry-105-a0-r0", cluster.nodes[0])
    cluster.backend.delete_pod(cluster.namespace, "gantry-105-a0-r0", grace_period_s=5)
    cluster.finish_deletion(cluster.namespace, "gantry-105-a0-r0")
    assert ours(cluster, "gantry-105-a0-r0") == []
    cluster.backend.delete_pod(cluster.namespace, "gantry-105-a0-r0", grace_period_s=5)


def test_unbound_pod_is_deleted_at_once(cluster: Cluster) -> None:
    cluster.backend.create_pod(request_for(cluster, 106))
    cluster.backend.delete_pod(cluster.namespace, "gantry-106-a0-r0")
    assert ours(cluster, "gantry-106-a0-r0") == []


def test_distributed_job_gets_a_headless_service_owned_by_rank_0(cluster: Cluster) -> None:
    for replica in (0, 1):
        pod = request_for(
            cluster, 107, replicas=2, replica=replica, name=f"gantry-107-a0-r{replica}"
        )
        cluster.backend.create_pod(pod)
    core = client.CoreV1Api(cluster.backend.api_client)
    service = raw(core.read_namespaced_service, "gantry-107-a0", cluster.namespace)
    assert service["spec"]["clusterIP"] == "None"
    (owner,) = service["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("Pod", "gantry-107-a0-r0")
    pod = raw(core.read_namespaced_pod, "gantry-107-a0-r1", cluster.namespace)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2"
    assert env["MASTER_ADDR"].startswith("gantry-107-a0-r0.gantry-107-a0.")


def test_pods_of_other_schedulers_are_not_listed(cluster: Cluster) -> None:
    core: Any = client.CoreV1Api(cluster.backend.api_client)  # a raw dict body, on purpose
    foreign = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "not-gantry", "labels": {"app.kubernetes.io/managed-by": "gantry"}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "image": PAUSE, "securityContext": {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
        },
    }  # fmt: skip
    core.create_namespaced_pod(cluster.namespace, foreign, _preload_content=False).release_conn()
    assert not [p for p in cluster.backend.list_pods() if p.name == "not-gantry"]


def test_watch_delivers_sync_then_changes(cluster: Cluster) -> None:
    synced: list[list[PodStatus]] = []
    events: list[tuple[str, PodStatus]] = []
    stop = threading.Event()

    def on_event(kind: str, status: PodStatus) -> None:
        events.append((kind, status))
        if status.name == "gantry-108-a0-r0" and status.node:
            stop.set()

    watcher = cluster.backend.pod_watcher(synced.append, on_event, timeout_s=30)
    watcher.run_once(stop)  # the list
    cluster.backend.create_pod(request_for(cluster, 108))
    cluster.backend.bind_pod(cluster.namespace, "gantry-108-a0-r0", cluster.nodes[0])
    watcher.run_once(stop)  # the watch, until the bind is seen
    assert len(synced) == 1
    kinds = [(kind, s.node) for kind, s in events if s.name == "gantry-108-a0-r0"]
    assert kinds[0] == ("ADDED", None)
    assert ("MODIFIED", cluster.nodes[0]) in kinds
