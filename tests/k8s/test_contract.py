"""The backend's contract, against the fake apiserver and the real one (tests/k8s/real_plane.py).

Each test uses only what both offer: the backend itself, and the kubelet's side through
`cluster.kubelet` (the fake is told what its kubelet does; devcluster's simulated kubelets act
on their own and are waited for). Pods are CPU-only `pause` containers so that the suite runs
on any cluster, GPU or not. Where the two servers differ, the test says how, and the fake was
mended to behave as the real one (docs/kubernetes.md, "What the real API server taught us").
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client

from scheduler.backends.base import (
    BindConflict,
    ClusterBackend,
    FailureReason,
    PodPhase,
    PodRequest,
    PodStatus,
)
from scheduler.backends.kubernetes.backend import ApiRejected
from scheduler.backends.kubernetes.watch import ListWatcher
from scheduler.backends.retry import RetryPolicy
from tests.k8s.builders import make_request
from tests.k8s.conftest import PAUSE, Cluster
from tests.k8s.real_plane import WAIT_S, drained


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
    drained(core.create_namespaced_pod(cluster.namespace, foreign, _preload_content=False))
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


def the_pod(cluster: Cluster, name: str) -> PodStatus:
    (status,) = ours(cluster, name)
    return status


def test_created_unbound_then_bound_runs_and_succeeds(cluster: Cluster) -> None:
    name, node = "gantry-110-a0-r0", cluster.nodes[0]
    cluster.backend.create_pod(request_for(cluster, 110))
    assert (the_pod(cluster, name).node, the_pod(cluster, name).phase) == (None, PodPhase.PENDING)
    cluster.backend.bind_pod(cluster.namespace, name, node)  # the Binding API
    cluster.kubelet.start(cluster.namespace, name)
    running = the_pod(cluster, name)
    assert (running.node, running.phase, running.reason) == (node, PodPhase.RUNNING, None)
    cluster.kubelet.succeed(cluster.namespace, name)
    done = the_pod(cluster, name)
    assert (done.phase, done.reason, done.deleting) == (PodPhase.SUCCEEDED, None, False)


def test_graceful_delete_leaves_the_pod_terminating_until_the_kubelet_confirms(
    cluster: Cluster,
) -> None:
    name = "gantry-111-a0-r0"
    cluster.backend.create_pod(request_for(cluster, 111))
    cluster.backend.bind_pod(cluster.namespace, name, cluster.nodes[0])
    cluster.kubelet.start(cluster.namespace, name)
    cluster.kubelet.keep_terminating(cluster.namespace, name)
    cluster.backend.delete_pod(cluster.namespace, name, grace_period_s=30)
    cluster.kubelet.look_again()
    terminating = the_pod(cluster, name)  # still holds its node: its devices are not free
    assert terminating.deleting and terminating.node == cluster.nodes[0]
    core = client.CoreV1Api(cluster.backend.api_client)
    meta = raw(core.read_namespaced_pod, name, cluster.namespace)["metadata"]
    assert meta["deletionGracePeriodSeconds"] == 30 and meta["deletionTimestamp"]
    cluster.kubelet.stopped(cluster.namespace, name)
    assert ours(cluster, name) == []


def test_a_pod_on_a_lost_node_stays_terminating(cluster: Cluster) -> None:
    name = "gantry-112-a0-r0"
    node = cluster.kubelet.add_node()
    cluster.backend.create_pod(request_for(cluster, 112, node=node))
    cluster.backend.bind_pod(cluster.namespace, name, node)
    cluster.kubelet.start(cluster.namespace, name)
    cluster.kubelet.lose_node(node)
    cluster.backend.delete_pod(cluster.namespace, name, grace_period_s=5)
    cluster.kubelet.look_again()
    stuck = the_pod(cluster, name)  # nobody is left to confirm that its containers stopped
    assert stuck.deleting and stuck.node == node and stuck.phase == PodPhase.RUNNING
    (lost,) = [n for n in cluster.backend.list_nodes() if n.name == node]
    assert not lost.ready


def test_image_pull_back_off_is_the_waiting_cause(cluster: Cluster) -> None:
    name = "gantry-113-a0-r0"
    cluster.backend.create_pod(request_for(cluster, 113))
    cluster.kubelet.fail_pull(cluster.namespace, name)
    cluster.backend.bind_pod(cluster.namespace, name, cluster.nodes[0])
    cluster.kubelet.start(cluster.namespace, name)
    waiting = the_pod(cluster, name)
    assert (waiting.phase, waiting.reason) == (PodPhase.PENDING, FailureReason.IMAGE_PULL)
    assert waiting.waiting.startswith("container main: ImagePullBackOff")


def test_a_pod_naming_a_missing_priority_class_is_refused(cluster: Cluster) -> None:
    """Found on the real server: admission refuses a pod whose PriorityClass does not exist
    (platform/k8s/01-priorityclasses.yaml must be applied); the fake let it in."""
    with pytest.raises(ApiRejected) as raised:
        cluster.backend.create_pod(request_for(cluster, 114, priority_class="no-such-class"))
    assert raised.value.status == 403
    body = json.loads(raised.value.__cause__.body)  # type: ignore[union-attr]
    assert "no PriorityClass with name gantry-no-such-class was found" in body["message"]
    assert ours(cluster, "gantry-114-a0-r0") == []


def test_a_pod_gets_its_priority_class_value(cluster: Cluster) -> None:
    """Found on the real server: admission copies the class's value and preemption policy into
    the pod (kube-scheduler and the kubelet's eviction order read them there)."""
    cluster.backend.create_pod(request_for(cluster, 115, priority_class="low"))
    core = client.CoreV1Api(cluster.backend.api_client)
    spec = raw(core.read_namespaced_pod, "gantry-115-a0-r0", cluster.namespace)["spec"]
    assert (spec["priorityClassName"], spec["priority"]) == ("gantry-low", 200)
    assert spec["preemptionPolicy"] == "Never"


def _watch_for(cluster: Cluster, name: str, seen: threading.Event) -> ListWatcher[PodStatus]:
    def saw(status: PodStatus) -> None:
        if status.name == name and status.node:
            seen.set()

    def on_sync(pods: list[PodStatus]) -> None:
        for status in pods:
            saw(status)

    return cluster.backend.pod_watcher(on_sync, lambda _kind, s: saw(s), timeout_s=30)


def test_watch_survives_a_forced_compaction(cluster: Cluster) -> None:
    """The fake answers 410 Gone to a watch from before the compaction and the watcher lists
    again. Found on the real server: its watch cache keeps serving a version it still holds
    after etcd compacted it, so the same watch just goes on (410 comes once the cache lost the
    version: after a restart, below)."""
    name, seen = "gantry-116-a0-r0", threading.Event()
    watcher = _watch_for(cluster, name, seen)
    watcher.run_once(seen)  # the list
    cluster.backend.create_pod(request_for(cluster, 116))
    cluster.backend.bind_pod(cluster.namespace, name, cluster.nodes[0])
    cluster.compact()  # past the list's version: the history the watch starts from is gone
    for _ in range(3):  # the stream (410 on the fake), then the list again
        if not seen.is_set():
            watcher.run_once(seen)
    assert seen.is_set()
    assert watcher.relists == (1 if cluster.real else 2)


def test_a_watch_from_before_a_restart_is_gone_and_lists_again(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """410 Gone on the real server: the restarted server's watch cache starts after the
    version the watcher holds. The watcher lists again at once, without counting a failure."""
    caplog.set_level(logging.INFO, logger="scheduler.backends.kubernetes.watch")
    name, seen = "gantry-120-a0-r0", threading.Event()
    watcher = _watch_for(cluster, name, seen)
    watcher.run_once(seen)  # the list
    cluster.restart_apiserver()
    cluster.backend.create_pod(request_for(cluster, 120))
    cluster.backend.bind_pod(cluster.namespace, name, cluster.nodes[0])
    watcher.run_once(seen)  # the stream, from the version before the restart
    assert (watcher.resource_version, watcher._failures, seen.is_set()) == (None, 0, False)
    assert "watch expired (410 Gone)" in caplog.text
    watcher.run_once(seen)  # the list again
    assert seen.is_set() and watcher.relists == 2


def test_watch_survives_an_apiserver_restart(cluster: Cluster) -> None:
    """The open stream breaks; the watcher lists again (the new server's watch cache answers
    410 to older versions) and sees what happened after the restart."""
    name, seen, stop = "gantry-117-a0-r0", threading.Event(), threading.Event()
    listed: list[int] = []
    first_list = threading.Event()
    watcher = _watch_for(cluster, name, seen)
    watcher.policy = RetryPolicy(attempts=8, base_s=0.1, cap_s=1.0)  # the restart is short
    watcher.sleep = stop.wait
    on_sync = watcher.on_sync

    def count_lists(pods: list[PodStatus]) -> None:
        listed.append(len(pods))
        first_list.set()
        on_sync(pods)

    watcher.on_sync = count_lists
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert first_list.wait(WAIT_S)
        cluster.restart_apiserver()
        cluster.backend.create_pod(request_for(cluster, 117))
        cluster.backend.bind_pod(cluster.namespace, name, cluster.nodes[0])
        assert seen.wait(WAIT_S)
    finally:
        stop.set()
        watcher.close()
        thread.join(timeout=WAIT_S)
    assert len(listed) >= 2  # the first list, and at least one after the restart


def test_the_headless_service_goes_with_rank_0(cluster: Cluster) -> None:
    """Found on the real server: the garbage collector (controller manager) removes the owned
    Service a moment after its owner; the fake's at once. Nothing may count on either."""
    for replica in (0, 1):
        cluster.backend.create_pod(
            request_for(cluster, 118, replicas=2, replica=replica, name=f"gantry-118-a0-r{replica}")
        )
    cluster.backend.delete_pod(cluster.namespace, "gantry-118-a0-r0")  # unbound: gone at once
    cluster.gone("services", cluster.namespace, "gantry-118-a0")
    assert [p.name for p in cluster.backend.list_pods() if p.job_id == 118] == ["gantry-118-a0-r1"]


def test_an_event_on_a_pod_is_listed_with_it(cluster: Cluster) -> None:
    name = "gantry-119-a0-r0"
    cluster.backend.create_pod(request_for(cluster, 119))
    cluster.backend.record_event(
        cluster.namespace, name, "WaitingForGpus", "2 of 8 GPUs free", warning=True
    )
    core = client.CoreV1Api(cluster.backend.api_client)
    events = raw(core.list_namespaced_event, cluster.namespace)["items"]
    (event,) = [e for e in events if e["reason"] == "WaitingForGpus"]
    assert (event["type"], event["message"]) == ("Warning", "2 of 8 GPUs free")
    assert (event["involvedObject"]["kind"], event["involvedObject"]["name"]) == ("Pod", name)
