"""docs/faults.md 11-17 and 23 at the backend level, against the fake apiserver.

The daemon's reactions (requeue, free the reservation, retry policy) are tested with the daemon;
here each test asserts what the backend tells the daemon, and what it leaves in the cluster.
No test sleeps: the backend's sleep is a recorder, and the only waits are the fake's own
bounded ones (a 0.5 s client timeout, a 50 ms idle watch).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import kubernetes_validate
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.backends.base import BackendError, BindConflict, FailureReason, NodeInfo, PodPhase
from scheduler.backends.kubernetes.backend import (
    ApiRejected,
    ForeignNamespace,
    ForeignPod,
    KubernetesBackend,
)
from scheduler.backends.kubernetes.render import UnsafePodSpec
from tests.k8s.builders import make_request
from tests.k8s.conftest import NAMESPACE, Sleeps
from tests.k8s.fake_apiserver import ApiError, FakeApiServer

POD = "gantry-7-a0-r0"
PODS = rf"^/api/v1/namespaces/{NAMESPACE}/pods$"
BINDING = rf"/pods/{POD}/binding$"


def pod_requests(fake: FakeApiServer, method: str, pattern: str) -> int:
    import re

    return sum(1 for m, p in fake.requests if m == method and re.search(pattern, p))


def created_and_bound(backend: KubernetesBackend, node: str = "gpu-1") -> None:
    backend.create_pod(make_request())
    backend.bind_pod(NAMESPACE, POD, node)


# -- 11. 409 on create and bind ---------------------------------------------------------------


def test_create_adopts_the_pod_a_crashed_daemon_created(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    backend.create_pod(make_request())
    uid = fake.get("pods", NAMESPACE, POD)["metadata"]["uid"]  # type: ignore[index]
    successor = KubernetesBackend(backend.api_client, backend.config, sleep=Sleeps())
    successor.create_pod(make_request())
    assert fake.get("pods", NAMESPACE, POD)["metadata"]["uid"] == uid  # type: ignore[index]
    assert pod_requests(fake, "POST", PODS) == 2 and pod_requests(fake, "GET", POD) == 1


def test_create_whose_answer_was_lost_is_retried_and_adopted(
    fake: FakeApiServer, backend: KubernetesBackend, sleeps: Sleeps
) -> None:
    fake.inject("lost", PODS, method="POST")
    backend.create_pod(make_request())
    assert [s.name for s in backend.list_pods()] == [POD]
    assert len(sleeps.delays) == 1


def test_a_look_alike_pod_is_never_adopted(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    # Someone with pod rights pre-created our next name, with their own image: adopting it
    # would run their pod on a GPU node outside quota.
    fake.add_namespace("team-b", {"app.kubernetes.io/managed-by": "gantry"})
    squatter = {
        "metadata": {"name": POD, "labels": {"gantry.io/job-id": "7"}},
        "spec": {"schedulerName": "gantry", "containers": [{"name": "main", "image": "miner"}]},
    }
    fake.create("pods", "team-b", squatter)
    with pytest.raises(ForeignPod):
        backend.create_pod(make_request(namespace="team-b"))
    kept = fake.get("pods", "team-b", POD)
    assert kept is not None and kept["spec"]["containers"][0]["image"] == "miner"
    assert "nodeName" not in kept["spec"]


def test_bind_whose_answer_was_lost_is_success(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    backend.create_pod(make_request())
    fake.inject("lost", BINDING)
    backend.bind_pod(NAMESPACE, POD, "gpu-1")  # the retry answers 409: already on gpu-1
    assert fake.get("pods", NAMESPACE, POD)["spec"]["nodeName"] == "gpu-1"  # type: ignore[index]
    assert pod_requests(fake, "POST", BINDING) == 2


def test_bind_race_lost_to_another_node(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    backend.create_pod(make_request())
    fake.bind(NAMESPACE, POD, {"target": {"name": "gpu-2"}})  # the other scheduler won
    with pytest.raises(BindConflict) as raised:
        backend.bind_pod(NAMESPACE, POD, "gpu-1")
    assert (raised.value.bound_node, raised.value.deleting) == ("gpu-2", False)
    assert fake.get("pods", NAMESPACE, POD)["spec"]["nodeName"] == "gpu-2"  # type: ignore[index]


def test_bind_of_a_pod_being_deleted_means_requeue(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    created_and_bound(backend)
    backend.delete_pod(NAMESPACE, POD, grace_period_s=30)
    with pytest.raises(BindConflict) as raised:
        backend.bind_pod(NAMESPACE, POD, "gpu-1")
    assert raised.value.deleting


def test_double_bind_is_refused_by_the_fake(fake: FakeApiServer) -> None:
    fake.create("pods", NAMESPACE, {"metadata": {"name": "p"}, "spec": {"containers": []}})
    fake.bind(NAMESPACE, "p", {"target": {"name": "gpu-1"}})
    with pytest.raises(ApiError) as raised:
        fake.bind(NAMESPACE, "p", {"target": {"name": "gpu-1"}})
    assert raised.value.code == 409


def test_client_v37_raises_after_a_successful_bind(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    """Why the backend binds with `_preload_content=False`: the plain call raises a ValueError
    (pydantic) on the Status object the apiserver answers, after the bind has happened."""
    backend.create_pod(make_request())
    core = client.CoreV1Api(backend.api_client)
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name=POD),
        target=client.V1ObjectReference(kind="Node", name="gpu-1"),
    )
    with pytest.raises(ValueError, match="V1Binding"):
        core.create_namespaced_pod_binding(POD, NAMESPACE, body)
    assert fake.get("pods", NAMESPACE, POD)["spec"]["nodeName"] == "gpu-1"  # type: ignore[index]


def test_a_real_bind_error_is_not_hidden(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    backend.create_pod(make_request())
    fake.inject("403", BINDING)  # e.g. RBAC without pods/binding
    with pytest.raises(ApiRejected) as raised:
        backend.bind_pod(NAMESPACE, POD, "gpu-1")
    assert raised.value.status == 403 and raised.value.retry_after_s is None
    assert isinstance(raised.value.__cause__, ApiException)
    assert isinstance(raised.value, BackendError)  # the daemon's failed-call path applies


# -- 12. 429, 5xx, timeouts, resets: bounded backoff with jitter ------------------------------

OPERATIONS: dict[str, tuple[str, str, Callable[[KubernetesBackend], Any]]] = {
    "list_nodes": ("GET", r"^/api/v1/nodes$", lambda b: b.list_nodes()),
    "list_pods": ("GET", r"^/api/v1/pods$", lambda b: b.list_pods()),
    "create": ("POST", PODS, lambda b: b.create_pod(make_request(job_id=8))),
    "bind": ("POST", BINDING, lambda b: b.bind_pod(NAMESPACE, POD, "gpu-1")),
    "delete": ("DELETE", rf"/pods/{POD}$", lambda b: b.delete_pod(NAMESPACE, POD, 0)),
    "cordon": ("PATCH", r"/nodes/gpu-1$", lambda b: b.set_node_unschedulable("gpu-1", True)),
}


@pytest.mark.parametrize("kind", ["429", "500", "503", "timeout", "reset"])
@pytest.mark.parametrize("operation", OPERATIONS, ids=OPERATIONS.keys())
def test_transient_failure_is_retried_once_and_succeeds(
    fake: FakeApiServer, backend: KubernetesBackend, sleeps: Sleeps, operation: str, kind: str
) -> None:
    method, path, call = OPERATIONS[operation]
    backend.create_pod(make_request())
    if kind == "timeout":  # the fake hangs 1 s; this client gives up after 0.5 s
        config = dataclasses.replace(backend.config, request_timeout_s=0.5)
        backend = KubernetesBackend(
            backend.api_client, config, policy=backend.policy, sleep=sleeps, rand=lambda: 0.5
        )
    fake.inject(kind, path, method=method, retry_after=1, delay_s=1.0)
    call(backend)
    assert pod_requests(fake, method, path) == 2 + (operation == "create")
    (delay,) = sleeps.delays
    # jitter 0.5 x base 0.1; a 429's Retry-After: 1 wins
    assert delay == (1.0 if kind == "429" else pytest.approx(0.05))
    if operation == "bind":
        assert fake.get("pods", NAMESPACE, POD)["spec"]["nodeName"] == "gpu-1"  # type: ignore[index]


def test_persistent_failure_gives_up_with_backend_error_and_creates_nothing(
    fake: FakeApiServer, backend: KubernetesBackend, sleeps: Sleeps
) -> None:
    fake.inject("503", PODS, method="POST", count=10)
    with pytest.raises(BackendError):
        backend.create_pod(make_request())
    assert pod_requests(fake, "POST", PODS) == 3  # RetryPolicy(attempts=3)
    assert len(sleeps.delays) == 2
    assert fake.get("pods", NAMESPACE, POD) is None


def test_long_retry_after_goes_up_to_the_daemon(
    fake: FakeApiServer, backend: KubernetesBackend, sleeps: Sleeps
) -> None:
    fake.inject("429", r"^/api/v1/nodes$", retry_after=30)
    with pytest.raises(BackendError) as raised:
        backend.list_nodes()
    assert raised.value.retry_after_s == 30.0
    assert sleeps.delays == [] and pod_requests(fake, "GET", r"^/api/v1/nodes$") == 1


def test_client_errors_are_answers_not_retried(
    fake: FakeApiServer, backend: KubernetesBackend, sleeps: Sleeps
) -> None:
    fake.inject("422", PODS, method="POST")
    with pytest.raises(ApiRejected) as raised:
        backend.create_pod(make_request())
    assert raised.value.status == 422 and sleeps.delays == []
    assert pod_requests(fake, "POST", PODS) == 1


def test_missing_project_namespace_is_created_restricted(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    backend.create_pod(make_request(namespace="team-new"))
    namespace = fake.get("namespaces", "", "team-new")
    assert namespace is not None
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert fake.get("pods", "team-new", POD) is not None


def test_pagination_reads_every_page(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    for i in range(3, 8):
        fake.add_node(f"gpu-{i}")
    paged = KubernetesBackend(
        backend.api_client, backend.config.__class__(page_size=2), sleep=Sleeps()
    )
    assert len(paged.list_nodes()) == 7
    assert pod_requests(fake, "GET", r"^/api/v1/nodes$") == 4


# -- 13. watches: 410 Gone, silent ends, resets -----------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.syncs: list[list[Any]] = []
        self.events: list[tuple[str, Any]] = []

    def sync(self, items: list[Any]) -> None:
        self.syncs.append(items)

    def event(self, kind: str, item: Any) -> None:
        self.events.append((kind, item))


def test_watch_resumes_after_410_by_relisting(
    fake: FakeApiServer, backend: KubernetesBackend, sleeps: Sleeps
) -> None:
    seen = Recorder()
    watcher = backend.pod_watcher(seen.sync, seen.event, timeout_s=5)
    watcher.run_once()
    backend.create_pod(make_request())
    fake.compact()  # the apiserver forgot the history the watcher would resume from
    watcher.run_once()  # ERROR 410 in the stream
    assert watcher.resource_version is None and sleeps.delays == []
    watcher.run_once()  # re-list: the pod created during the gap is there
    assert [[s.name for s in sync] for sync in seen.syncs] == [[], [POD]]
    assert watcher.relists == 2


def test_watch_that_ends_silently_is_followed_by_a_relist(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    fake.watch_linger_s = 0.05  # the stream closes after 50 ms without events, no error
    seen = Recorder()
    watcher = backend.pod_watcher(seen.sync, seen.event, timeout_s=5)
    watcher.run_once()
    created_and_bound(backend)
    watcher.run_once()
    assert [(kind, s.node) for kind, s in seen.events] == [("ADDED", None), ("MODIFIED", "gpu-1")]
    assert watcher.resource_version is None
    watcher.run_once()
    assert watcher.relists == 2 and seen.syncs[-1][0].node == "gpu-1"


def test_watch_reset_mid_stream_backs_off_and_relists(
    fake: FakeApiServer, backend: KubernetesBackend, sleeps: Sleeps
) -> None:
    seen = Recorder()
    watcher = backend.pod_watcher(seen.sync, seen.event, timeout_s=5)
    watcher.run_once()
    fake.inject("reset", r"^/api/v1/pods$", watch=True)
    backend.create_pod(make_request())
    watcher.run_once()  # one event, then the connection is reset
    assert [kind for kind, _ in seen.events] == ["ADDED"]
    assert len(sleeps.delays) == 1 and watcher.resource_version is None
    watcher.run_once()
    assert watcher.relists == 2


def test_watch_answered_with_http_410_relists_at_once(
    fake: FakeApiServer, backend: KubernetesBackend, sleeps: Sleeps
) -> None:
    fake.inject("410", r"^/api/v1/pods$", watch=True)
    seen = Recorder()
    watcher = backend.pod_watcher(seen.sync, seen.event, timeout_s=5)
    watcher.run_once()
    watcher.run_once()  # HTTP 410 instead of a stream
    assert watcher.resource_version is None and sleeps.delays == []


def test_watch_list_failure_backs_off(
    fake: FakeApiServer, backend: KubernetesBackend, sleeps: Sleeps
) -> None:
    fake.inject("503", r"^/api/v1/nodes$", count=3)
    seen = Recorder()
    watcher = backend.node_watcher(seen.sync, seen.event)
    watcher.run_once()
    # the list's own two retries (0.05, 0.1), then the watcher's backoff before re-listing
    assert seen.syncs == [] and sleeps.delays == pytest.approx([0.05, 0.1, 0.05])
    watcher.run_once()
    assert [n.name for n in seen.syncs[0]] == ["gpu-1", "gpu-2"]


def test_watch_loop_runs_in_a_thread_until_stopped(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    fake.watch_linger_s = 0.05
    seen = Recorder()
    stop = threading.Event()
    watcher = backend.node_watcher(seen.sync, seen.event, timeout_s=5)
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not seen.syncs and time.monotonic() < deadline:
        time.sleep(0.01)
    fake.delete_node("gpu-2")
    while not any(k == "DELETED" for k, _ in seen.events) and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    fake.end_watches()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert ("DELETED", "gpu-2") in [(k, n.name) for k, n in seen.events]
    assert watcher.relists >= 1


def test_close_breaks_an_idle_watch_at_once(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    seen = Recorder()
    watcher = backend.pod_watcher(seen.sync, seen.event, timeout_s=60)
    thread = threading.Thread(target=watcher.run, args=(threading.Event(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while watcher._response is None and time.monotonic() < deadline:  # the stream is open
        time.sleep(0.01)
    watcher.close()
    thread.join(timeout=5)
    assert not thread.is_alive() and seen.syncs == [[]]


def test_close_before_the_stream_opens_opens_none(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    """close() between the list and the stream found no stream to break, and the stream then
    opened and held the closing daemon until the server ended it (timeout_s)."""
    seen = Recorder()
    watcher = backend.pod_watcher(seen.sync, seen.event, timeout_s=1)
    watcher.run_once()  # the list
    watcher.close()
    requests = len(fake.requests)
    watcher.run_once()  # would have been the stream
    assert len(fake.requests) == requests  # no stream opened
    assert seen.syncs == [[]] and seen.events == []


def test_watch_loop_survives_a_refusal(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    fake.inject("403", r"^/api/v1/nodes$")  # e.g. RBAC fixed a minute later
    stop = threading.Event()
    waits: list[float] = []
    watcher = backend.node_watcher(lambda items: stop.set(), lambda kind, node: None)
    watcher.sleep = waits.append
    watcher.run(stop)  # 403 -> logged, waits the cap -> re-lists -> on_sync stops the loop
    assert waits == [30.0] and watcher.relists == 1


# -- 14. the kubelet rejects a bound pod ------------------------------------------------------


def test_kubelet_rejection_is_reported_and_the_node_refreshed(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    created_and_bound(backend)
    fake.mutate("nodes", "", "gpu-1", lambda n: n["status"]["allocatable"].update(
        {"nvidia.com/gpu": "7"}))  # fmt: skip
    fake.set_pod_status(NAMESPACE, POD, {
        "phase": "Failed", "reason": "OutOfnvidia.com/gpu",
        "message": "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu",
    })  # fmt: skip
    (status,) = backend.list_pods()
    assert (status.phase, status.reason, status.node) == (
        PodPhase.FAILED, FailureReason.REJECTED, "gpu-1")  # fmt: skip
    assert "nvidia.com/gpu" in status.message
    node = backend.get_node("gpu-1")
    assert node is not None and sum(g.healthy for g in node.gpus) == 7


# -- 15. NotReady, deleted, shrunk ------------------------------------------------------------


def nodes(backend: KubernetesBackend) -> dict[str, NodeInfo]:
    return {n.name: n for n in backend.list_nodes()}


def test_node_not_ready(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    lost = [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]
    fake.mutate("nodes", "", "gpu-1", lambda n: n["status"].update(conditions=lost))
    assert not nodes(backend)["gpu-1"].ready and nodes(backend)["gpu-2"].ready


def test_deleted_node_and_its_pods(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    created_and_bound(backend, "gpu-2")
    fake.delete_node("gpu-2")
    fake.mutate("pods", NAMESPACE, POD, lambda p: (
        p["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"),
        p["status"].update(conditions=[{"type": "DisruptionTarget", "status": "True",
                                        "reason": "DeletionByPodGC"}]),
    ))  # fmt: skip
    assert set(nodes(backend)) == {"gpu-1"} and backend.get_node("gpu-2") is None
    (status,) = backend.list_pods()
    assert (status.reason, status.deleting, status.node) == (FailureReason.NODE_LOST, True, "gpu-2")


@pytest.mark.parametrize(("allocatable", "healthy"), [("6", 6), ("0", 0), ("-1", 0)])
def test_shrunk_allocatable_after_an_xid(
    fake: FakeApiServer, backend: KubernetesBackend, allocatable: str, healthy: int
) -> None:
    fake.mutate("nodes", "", "gpu-1", lambda n: n["status"]["allocatable"].update(
        {"nvidia.com/gpu": allocatable}))  # fmt: skip
    node = nodes(backend)["gpu-1"]
    assert len(node.gpus) == 8 and sum(g.healthy for g in node.gpus) == healthy


def test_cordon_and_uncordon(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    backend.set_node_unschedulable("gpu-1", True)
    assert fake.get("nodes", "", "gpu-1")["spec"]["unschedulable"] is True  # type: ignore[index]
    assert nodes(backend)["gpu-1"].unschedulable
    backend.set_node_unschedulable("gpu-1", False)
    assert not nodes(backend)["gpu-1"].unschedulable


def test_stale_update_is_a_conflict(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    core: Any = client.CoreV1Api(backend.api_client)  # raw dict bodies, on purpose
    node = fake.get("nodes", "", "gpu-1")
    assert node is not None
    backend.set_node_unschedulable("gpu-1", True)  # someone else wrote in between
    with pytest.raises(ApiException) as raised:
        core.replace_node("gpu-1", node, _preload_content=False)
    assert raised.value.status == 409


# -- 16. failure reasons through the API ------------------------------------------------------

STATUSES = {
    "oom": ({"phase": "Failed", "containerStatuses": [{"name": "main", "state": {
        "terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}, FailureReason.OOM_KILLED),
    "evicted": ({"phase": "Failed", "reason": "Evicted"}, FailureReason.EVICTED),
    "image": ({"phase": "Pending", "containerStatuses": [{"name": "main", "state": {
        "waiting": {"reason": "ImagePullBackOff"}}}]}, FailureReason.IMAGE_PULL),
    "crash": ({"phase": "Running", "containerStatuses": [{"name": "main", "state": {
        "waiting": {"reason": "CrashLoopBackOff"}}}]}, FailureReason.CRASH_LOOP),
    "deadline": ({"phase": "Failed", "reason": "DeadlineExceeded"},
                 FailureReason.DEADLINE_EXCEEDED),
    "preempted": ({"phase": "Running", "conditions": [{"type": "DisruptionTarget",
        "status": "True", "reason": "PreemptionByScheduler"}]}, FailureReason.PREEMPTED),
}  # fmt: skip


@pytest.mark.parametrize(("status", "reason"), STATUSES.values(), ids=STATUSES.keys())
def test_failure_reasons_through_the_api(
    fake: FakeApiServer, backend: KubernetesBackend, status: dict[str, Any], reason: Any
) -> None:
    created_and_bound(backend)
    fake.set_pod_status(NAMESPACE, POD, status)
    (parsed,) = backend.list_pods()
    assert parsed.reason == reason


# -- 17. a preempted pod keeps its GPUs until it is really gone -------------------------------


def test_preempted_pod_holds_its_node_until_gone(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    created_and_bound(backend)
    backend.delete_pod(NAMESPACE, POD, grace_period_s=45)  # the victim's grace period
    raw = fake.get("pods", NAMESPACE, POD)
    assert raw is not None and raw["metadata"]["deletionGracePeriodSeconds"] == 45
    (status,) = backend.list_pods()
    assert status.deleting and status.node == "gpu-1"  # still holding gpu-1's devices
    backend.delete_pod(NAMESPACE, POD, grace_period_s=45)  # repeated: still fine
    fake.finalize_pod(NAMESPACE, POD)
    assert backend.list_pods() == []


# -- 23. dangerous pod fields -----------------------------------------------------------------


def test_unsafe_request_creates_nothing(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    with pytest.raises(UnsafePodSpec) as raised:
        backend.create_pod(make_request(env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, BackendError)
    assert pod_requests(fake, "POST", PODS) == 0


def test_restricted_namespace_rejects_a_privileged_pod(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    """The fake enforces the restricted standard, so the contract tests' pods passing it means
    something: a hand-made privileged pod is refused."""
    core: Any = client.CoreV1Api(backend.api_client)
    pod = {
        "metadata": {"name": "bad"},
        "spec": {"hostNetwork": True, "containers": [
            {"name": "c", "image": "x", "securityContext": {"privileged": True}}]},
    }  # fmt: skip
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_pod(NAMESPACE, pod, _preload_content=False)
    assert raised.value.status == 403
    backend.create_pod(make_request())  # ours is admitted
    assert fake.get("pods", NAMESPACE, POD) is not None


def test_ensure_namespace_enforces_restricted(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    backend.ensure_namespace("team-c")
    backend.ensure_namespace("team-c")  # exists: fine
    labels = fake.get("namespaces", "", "team-c")["metadata"]["labels"]  # type: ignore[index]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_pods_never_land_in_a_namespace_gantry_did_not_create(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    """Issue 17, point 9: a project pointed at another group's namespace (no Pod Security
    labels, not Gantry's) gets no pods there."""
    fake.add_namespace("ml-prod")
    with pytest.raises(ForeignNamespace, match="not created by Gantry"):
        backend.create_pod(make_request(namespace="ml-prod"))
    assert fake.list_objects("pods", "ml-prod", {})["items"] == []


def test_a_missing_project_namespace_is_created_as_gantrys(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    backend.create_pod(make_request(namespace="proj-new"))
    labels = fake.get("namespaces", "", "proj-new")["metadata"]["labels"]  # type: ignore[index]
    assert labels["app.kubernetes.io/managed-by"] == "gantry"
    assert fake.get("pods", "proj-new", POD) is not None


def test_events_explain_a_pod(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    backend.create_pod(make_request())
    backend.record_event(NAMESPACE, POD, "Waiting", "quota: team-a uses 16/16 H100", warning=True)
    (event,) = fake.list_objects("events", NAMESPACE, {})["items"]
    assert event["involvedObject"]["name"] == POD and event["type"] == "Warning"
    assert event["message"] == "quota: team-a uses 16/16 H100"


def test_event_manifest_is_valid() -> None:
    from scheduler.backends.kubernetes.render import render_event

    event = render_event(NAMESPACE, POD, "Bound", "bound to gpu-1", False, "2026-01-01T00:00:00Z")
    assert kubernetes_validate.validate(event, "1.30", strict=True)


def test_default_construction_reads_kubeconfig_and_env(
    fake: FakeApiServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: f, cluster: {{server: '{fake.url}'}}}}]\n"
        "users: [{name: u, user: {token: t0k}}]\n"
        "contexts: [{name: c, context: {cluster: f, user: u}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("GANTRY_K8S_SHARE_MEMORY_RESOURCE", "example.com/vram")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    backend = KubernetesBackend()
    try:
        assert {n.name for n in backend.list_nodes()} == {"gpu-1", "gpu-2"}
        assert backend.config.share_memory_resource == "example.com/vram"
        assert client.Configuration.get_default_copy().host != fake.url  # no global change
    finally:
        backend.api_client.close()


def test_the_pod_watch_wakes_the_daemon_when_pods_change(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    """`watch_pods` runs the list/watch loop in a thread and sets its event on every change
    of Gantry's pods; stopping it ends the thread."""
    stop = threading.Event()
    changed = backend.watch_pods(stop, timeout_s=5)
    try:
        assert changed.wait(5.0)  # the first list
        changed.clear()
        backend.create_pod(make_request())
        assert changed.wait(5.0)  # ADDED
        changed.clear()
        backend.bind_pod(NAMESPACE, POD, "gpu-1")
        assert changed.wait(5.0)  # MODIFIED: bound
    finally:
        stop.set()
        backend.close_watches()
    watch = [t for t in threading.enumerate() if t.name == "gantry-pod-watch"]
    for thread in watch:
        thread.join(5.0)
    assert not any(t.is_alive() for t in watch)


# -- issue 17: pods that never start, pods that never finish terminating ----------------------


@pytest.mark.parametrize(
    ("reason", "message", "unschedulable"),
    [
        ("ImagePullBackOff", 'Back-off pulling image "registry.example/x:1"', False),
        ("CreateContainerConfigError", 'secret "hf-token" not found', False),
        ("Unschedulable", "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", True),
    ],
)
def test_a_pod_that_never_starts_reports_its_cause(
    fake: FakeApiServer,
    backend: KubernetesBackend,
    reason: str,
    message: str,
    unschedulable: bool,
) -> None:
    created_and_bound(backend)
    fake.stay_pending(NAMESPACE, POD, reason, message, unschedulable=unschedulable)
    (status,) = backend.list_pods()
    assert status.phase == PodPhase.PENDING
    assert f"{reason}: {message}" in status.waiting


def test_a_pod_never_finalized_stays_terminating(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    """A dead node's kubelet never confirms a graceful deletion: the pod stays listed,
    deleting, until it is forced (grace 0) as the daemon does past its node-lost grace."""
    created_and_bound(backend)
    backend.delete_pod(NAMESPACE, POD, grace_period_s=30)
    backend.delete_pod(NAMESPACE, POD, grace_period_s=30)
    (status,) = backend.list_pods()
    assert status.deleting
    backend.delete_pod(NAMESPACE, POD, grace_period_s=0)
    assert backend.list_pods() == []
