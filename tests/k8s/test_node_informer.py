"""The inventory sync reads the nodes from the node watch's cache while that watch is live,
instead of listing every node every cycle (5,000 nodes took the daemon 1.6 s a cycle); it
lists as before once the stream ended, until the next list, and sees its own cordons at
once (read-your-writes by resourceVersion)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from scheduler.backends.base import NodeInfo
from scheduler.backends.kubernetes.backend import KubernetesBackend
from scheduler.backends.kubernetes.informer import NodeInformer
from tests.k8s.fake_apiserver import FakeApiServer


def node(name: str, *, unschedulable: bool = False) -> NodeInfo:
    return NodeInfo(name, "H100", (), 96_000, 1 << 20, unschedulable=unschedulable)


def names(nodes: list[NodeInfo] | None) -> set[str] | None:
    return None if nodes is None else {n.name for n in nodes}


# -- the cache --------------------------------------------------------------------------------


def test_it_answers_only_from_a_list_until_its_stream_ends() -> None:
    informer = NodeInformer(wait_s=0)
    assert informer.nodes() is None  # never listed
    informer.synced([node("a"), node("b")], "10")
    assert names(informer.nodes()) == {"a", "b"}
    informer.changed("ADDED", node("c"), "11")
    informer.changed("DELETED", node("a"), "12")
    assert names(informer.nodes()) == {"b", "c"}
    informer.lapsed()  # the stream ended: it may miss changes from here
    assert informer.nodes() is None
    informer.synced([node("b")], "20")  # the next list
    assert names(informer.nodes()) == {"b"}
    assert (informer.reads, informer.fallbacks) == (3, 2)


def test_the_first_read_waits_for_the_first_list_and_no_later_read_waits() -> None:
    informer = NodeInformer(wait_s=5.0)
    listing = threading.Timer(0.2, informer.synced, args=([node("a")], "10"))
    listing.start()
    assert names(informer.nodes()) == {"a"}  # waited for the list, not None at once
    listing.join()
    informer.lapsed()  # a watch that cannot list again (a 403, an outage) ...
    began = time.monotonic()
    assert informer.nodes() is None  # ... costs a read nothing: the caller lists at once
    assert time.monotonic() - began < 1.0


def test_a_first_read_that_finds_no_list_within_its_wait_says_nothing() -> None:
    informer = NodeInformer(wait_s=0.1)
    assert informer.nodes() is None
    assert not informer.wait_listed(0.05)
    informer.synced([node("a")], "10")
    assert informer.wait_listed(0.05) and names(informer.nodes()) == {"a"}


def test_an_event_older_than_our_write_does_not_undo_it() -> None:
    informer = NodeInformer()
    informer.synced([node("a")], "10")
    informer.changed("MODIFIED", node("a", unschedulable=True), "15")  # our cordon's answer
    informer.changed("MODIFIED", node("a"), "12")  # an event from before it, late
    [kept] = informer.nodes() or []
    assert kept.unschedulable is True
    informer.changed("MODIFIED", node("a"), "16")  # an uncordon after it
    [kept] = informer.nodes() or []
    assert kept.unschedulable is False


def test_a_version_that_is_not_a_number_makes_it_say_nothing_for_good() -> None:
    informer = NodeInformer(wait_s=0)
    informer.synced([node("a")], "10")
    informer.changed("MODIFIED", node("a"), "not-etcd")
    assert informer.nodes() is None
    informer.synced([node("a")], "30")
    assert informer.nodes() is None


# -- the backend, on the fake API server ------------------------------------------------------


@pytest.fixture
def watched(backend: KubernetesBackend) -> Iterator[KubernetesBackend]:
    stop = threading.Event()
    backend.watch_pods(stop, timeout_s=30)
    yield backend
    stop.set()
    backend.close_watches()


def until(check: object, what: str) -> None:
    for _ in range(200):
        if callable(check) and check():
            return
        threading.Event().wait(0.05)
    raise AssertionError(what)


def node_lists(fake: FakeApiServer) -> int:
    return sum(1 for method, path in fake.requests if method == "GET" and path == "/api/v1/nodes")


def test_with_the_watches_running_list_nodes_reads_the_cache_and_sees_changes_and_cordons(
    fake: FakeApiServer, watched: KubernetesBackend
) -> None:
    informer = watched.node_informer
    assert informer is not None
    assert informer.wait_listed(10.0), "the node watch never listed"
    until(lambda: fake.streaming.get("nodes"), "the node watch never opened its stream")
    listed, fallbacks = node_lists(fake), informer.fallbacks
    assert {n.name for n in watched.list_nodes()} == {"gpu-1", "gpu-2"}
    fake.add_node("gpu-3")
    until(lambda: "gpu-3" in {n.name for n in watched.list_nodes()}, "gpu-3 never seen")
    watched.set_node_unschedulable("gpu-1", True)  # seen at once, from the write's answer
    assert {n.name for n in watched.list_nodes() if n.unschedulable} == {"gpu-1"}
    fake.delete_node("gpu-2")
    until(lambda: "gpu-2" not in {n.name for n in watched.list_nodes()}, "gpu-2 still there")
    assert node_lists(fake) == listed  # every read from the cache: nothing listed
    assert informer.fallbacks == fallbacks


def test_once_the_node_stream_ends_list_nodes_lists_from_the_server_until_the_next_list(
    fake: FakeApiServer, watched: KubernetesBackend
) -> None:
    """The next node stream hangs: between the end of one stream and the next list the cache
    says nothing, and a read lists; the watch lists again, and the cache answers again."""
    informer = watched.node_informer
    assert informer is not None
    informer.wait_s = 0.1  # shorter than the slow list below
    until(lambda: fake.streaming.get("nodes"), "the node watch never opened its stream")
    fake.inject("timeout", "^/api/v1/nodes$", delay_s=1.0, count=1)  # the re-list, slow
    fake.end_watches()
    until(lambda: informer.nodes() is None, "the cache still answers after its stream ended")
    before = node_lists(fake)
    fake.add_node("gpu-9")  # while the watch cannot see it
    assert "gpu-9" in {n.name for n in watched.list_nodes()}  # listed, not the stale cache
    assert node_lists(fake) >= before + 1
    assert informer.wait_listed(10.0), "the watch never listed again"
    assert "gpu-9" in (names(informer.nodes()) or set())
