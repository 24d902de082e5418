"""Issue 37: reconcile reads Gantry's pods from the watch's cache, and still sees its own
writes at once (read-your-writes by resourceVersion), falling back to a list when the cache
cannot say (never synced, too slow, versions that are not numbers)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from scheduler.backends.base import PodPhase, PodStatus
from scheduler.backends.kubernetes.backend import KubernetesBackend
from scheduler.backends.kubernetes.informer import FAILED_GONE_S, PodInformer
from tests.k8s.builders import make_request
from tests.k8s.conftest import NAMESPACE
from tests.k8s.fake_apiserver import FakeApiServer


def status(name: str, node: str | None = None, phase: PodPhase = PodPhase.PENDING) -> PodStatus:
    return PodStatus(name, "team-a", 1, 0, 0, node, phase)


def test_a_list_replaces_the_cache_and_events_change_one_pod_each() -> None:
    informer = PodInformer(wait_s=0)
    informer.synced([status("a"), status("b")], "10")
    informer.changed("MODIFIED", status("a", "gpu-1", PodPhase.RUNNING), "11")
    informer.changed("DELETED", status("b"), "12")
    informer.changed("ADDED", status("c"), "13")
    assert {(p.name, p.node, p.phase) for p in informer.pods() or ()} == {
        ("a", "gpu-1", PodPhase.RUNNING),
        ("c", None, PodPhase.PENDING),
    }
    informer.synced([status("z")], "20")
    assert [p.name for p in informer.pods() or ()] == ["z"]


def companion(
    name: str, phase: PodPhase, *, deleting: bool = False, role: str = "driver"
) -> PodStatus:
    return PodStatus(name, "team-a", 1, -1, 0, "gpu-1", phase, companion=role, deleting=deleting)


def test_a_companion_seen_failed_is_kept_a_while_after_it_goes() -> None:
    """Seen Failed, then deleting, then deleted (an operator deleted its object): it is
    given as it was when it failed from the moment it went, for FAILED_GONE_S, and never
    among the pods."""
    now = [100.0]
    informer = PodInformer(wait_s=0, monotonic=lambda: now[0])
    informer.synced([companion("d", PodPhase.RUNNING)], "10")
    informer.changed("MODIFIED", companion("d", PodPhase.FAILED), "11")
    assert informer.failed_gone() == []  # still there: reconcile reads it among the pods
    informer.changed("MODIFIED", companion("d", PodPhase.FAILED, deleting=True), "12")
    informer.changed("DELETED", companion("d", PodPhase.FAILED, deleting=True), "13")
    assert informer.failed_gone() == [companion("d", PodPhase.FAILED)]
    assert informer.pods() == []
    now[0] += FAILED_GONE_S - 1
    assert [p.name for p in informer.failed_gone()] == ["d"]
    now[0] += 2
    assert informer.failed_gone() == []


def test_what_is_not_a_failure_seen_before_it_went_is_not_kept() -> None:
    """A pod of a replica (not a companion), a companion first seen Failed while already
    deleting (its end may be the deletion's), one deleted while running: none is kept. One
    that a re-list no longer holds went at that list."""
    informer = PodInformer(wait_s=0)
    informer.synced([], "10")
    informer.changed("MODIFIED", status("replica", "gpu-1", PodPhase.FAILED), "11")
    informer.changed("DELETED", status("replica", "gpu-1", PodPhase.FAILED), "12")
    informer.changed("MODIFIED", companion("late", PodPhase.FAILED, deleting=True), "13")
    informer.changed("DELETED", companion("late", PodPhase.FAILED, deleting=True), "14")
    informer.changed("ADDED", companion("ran", PodPhase.RUNNING), "15")
    informer.changed("DELETED", companion("ran", PodPhase.RUNNING), "16")
    assert informer.failed_gone() == []
    informer.changed("MODIFIED", companion("missed", PodPhase.FAILED, role="head"), "17")
    informer.synced([], "30")  # its DELETED event was missed: the list no longer has it
    assert [p.name for p in informer.failed_gone()] == ["missed"]


def test_a_read_waits_until_the_cache_has_seen_our_own_write() -> None:
    informer = PodInformer(wait_s=5.0)
    informer.synced([], "10")
    informer.wrote("12")  # we created pod d; its event has not come yet
    threading.Timer(0.2, lambda: informer.changed("ADDED", status("d"), "12")).start()
    assert [p.name for p in informer.pods() or ()] == ["d"]  # never the cache without it
    assert informer.reads == 1 and informer.fallbacks == 0


def test_a_cache_that_does_not_catch_up_in_time_is_not_read() -> None:
    informer = PodInformer(wait_s=0.05)
    informer.synced([], "10")
    informer.wrote("12")
    assert informer.pods() is None and informer.fallbacks == 1


def test_never_synced_stopped_or_without_numeric_versions_it_says_nothing() -> None:
    assert PodInformer(wait_s=0).pods() is None
    stopped = PodInformer(wait_s=0)
    stopped.synced([status("a")], "5")
    stopped.lost()
    assert stopped.pods() is None
    opaque = PodInformer(wait_s=0)
    opaque.synced([status("a")], "not-etcd")
    assert opaque.pods() is None


def test_a_bind_of_ours_shows_before_its_event_and_the_event_wins_after() -> None:
    informer = PodInformer(wait_s=0)
    informer.synced([status("a")], "10")
    informer.bound("team-a", "a", "gpu-2")
    assert [p.node for p in informer.pods() or ()] == ["gpu-2"]
    informer.changed("MODIFIED", status("a", "gpu-2", PodPhase.RUNNING), "11")
    informer.changed("DELETED", status("a", "gpu-2"), "12")
    assert informer.pods() == []


@pytest.fixture
def watched(backend: KubernetesBackend) -> Iterator[KubernetesBackend]:
    stop = threading.Event()
    changed = backend.watch_pods(stop, timeout_s=30)
    assert changed.wait(5.0)  # the first list
    yield backend
    stop.set()
    backend.close_watches()


def wait_for_a_stream(fake: FakeApiServer) -> None:
    for _ in range(200):
        if fake.streaming.get("pods"):
            return
        threading.Event().wait(0.05)
    raise AssertionError("the watch never opened its stream")


def lists_of_pods(fake: FakeApiServer) -> int:
    return sum(1 for method, path in fake.requests if method == "GET" and path == "/api/v1/pods")


def test_with_the_watch_running_list_pods_reads_the_cache_and_sees_our_writes(
    fake: FakeApiServer, watched: KubernetesBackend
) -> None:
    for job_id in range(1, 6):
        watched.create_pod(make_request(job_id))
        names = {p.name for p in watched.list_pods()}
        assert f"gantry-{job_id}-a0-r0" in names  # at once: created, then read
    watched.delete_pod(NAMESPACE, "gantry-1-a0-r0", grace_period_s=0)
    assert "gantry-1-a0-r0" not in {p.name for p in watched.list_pods()}
    # Every read came from the cache (the watch's own re-lists, after a stream that ended
    # on a busy host, are the informer's, not reads'): list_pods listed nothing.
    assert watched.informer is not None
    assert (watched.informer.reads, watched.informer.fallbacks) == (6, 0)


def test_when_the_watch_stalls_list_pods_lists_from_the_server(
    fake: FakeApiServer, watched: KubernetesBackend
) -> None:
    """The watch's next stream hangs (no events come): a read after our write does not trust
    the stale cache; it lists, and finds the pod."""
    assert watched.informer is not None
    watched.informer.wait_s = 0.2
    wait_for_a_stream(fake)  # else the end below lands before it opens, and ends nothing
    fake.inject("timeout", "^/api/v1/pods$", watch=True, delay_s=3.0, count=1)
    fault = fake.faults[-1]
    fake.end_watches()  # the watch re-lists, then opens a stream that hangs
    for _ in range(100):
        if fault.remaining == 0:
            break
        threading.Event().wait(0.05)
    assert fault.remaining == 0, "the watch did not open its next stream"
    watched.create_pod(make_request(9))
    before = lists_of_pods(fake)
    names = {p.name for p in watched.list_pods()}
    assert "gantry-9-a0-r0" in names and lists_of_pods(fake) >= before + 1
    assert watched.informer.fallbacks == 1
