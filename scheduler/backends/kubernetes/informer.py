"""Gantry's pods and the cluster's nodes as the daemon's watches have seen them: the
informers' caches, from which reconcile and the inventory sync read instead of listing every
pod and every node from the API server every cycle.

The pod watch (`KubernetesBackend.watch_pods`) fills it: a list replaces it whole, each event
changes one pod. Every stream end is a re-list (`ListWatcher`), at least every `timeout_s`:
the periodic relist that catches what a watch could have missed.

Read-your-writes: a cycle must see the pods it created, bound or deleted itself, or reconcile
would judge a pod it just made as vanished. The backend notes the resourceVersion of every
write's answer (`wrote`); `pods()` answers only once the cache has seen events at least that
recent (etcd's versions grow with every write; a version that is not a number makes the cache
unusable, and the backend lists from the API server as before). It waits up to `wait_s` for
the watch to catch up, then gives up (None): the caller lists.

Nodes (`NodeInformer`): the daemon syncs its inventory every second, and listing 5,000 nodes
took it 1.6 s of a cycle (bench.k8s_peers). The node watch's cache answers only while its
stream is live: from a list until that stream ends, for any reason (`ListWatcher.on_lapse`);
then None until the next list, and the caller lists as before. A stream ends at least every
`node_watch_s` (the daemon's: 60 s), and one that hangs breaks on its read timeout 30 s later,
so a cache that answers is never older than its last event by more than that. The daemon's own
writes to a node (cordons) are kept from their answers, so the next read sees them; an older
event of the same node does not undo one. Only the first read waits, for the first list.

A companion pod seen Failed (and not being deleted) is kept for `FAILED_GONE_S` after it goes
(deleting, or deleted): an operator deletes a failed companion's object within a second or two
(JobSet's manager the Jobs of a JobSet its driver failed), often between two cycles, and
reconcile still tells the failure (`failed_companions`, daemon/companions/faults.py). Kept
apart from the pods: nothing else reads a pod that went as present.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

from scheduler.backends.base import NodeInfo, PodPhase, PodStatus

FAILED_GONE_S = 60.0  # how long a failed companion is remembered after its pod went


def version(text: object) -> int | None:
    """A resourceVersion as a number, or None (absent, or not etcd's)."""
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


class PodInformer:
    def __init__(
        self, wait_s: float = 2.0, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.wait_s, self.monotonic = wait_s, monotonic
        self._pods: dict[tuple[str, str], PodStatus] = {}
        self._seen = -1  # the newest version the cache holds (-1: never synced)
        self._written = -1  # the newest version of this process's own writes
        self._usable = True  # False once a version was not a number
        # Binds of ours whose events have not come yet (a bind answers a Status, without a
        # version): pod -> node, shown on the cached pod until its event shows it bound.
        self._binds: dict[tuple[str, str], str] = {}
        # Companion pods seen Failed, not deleting: pod -> (that state, when it went or None).
        self._failed: dict[tuple[str, str], tuple[PodStatus, float | None]] = {}
        self._changed = threading.Condition()
        self.reads = self.fallbacks = 0  # answered from the cache / left to a list

    # -- from the watch's thread ---------------------------------------------------------------

    def synced(self, pods: list[PodStatus], rv: str) -> None:
        """A list: the cache is replaced whole, as of version `rv`."""
        seen = version(rv)
        with self._changed:
            self._pods = {(p.namespace, p.name): p for p in pods}
            for key in [k for k in self._binds if (p := self._pods.get(k)) is None or p.node]:
                del self._binds[key]
            for key, pod in self._pods.items():
                self._note_failed(key, pod)
            for key in [k for k in self._failed if k not in self._pods]:
                self._went(key)
            self._note(seen)
            self._changed.notify_all()

    def changed(self, kind: str, pod: PodStatus, rv: str | None) -> None:
        """One event: ADDED or MODIFIED keeps the pod's new state, DELETED drops it."""
        with self._changed:
            key = (pod.namespace, pod.name)
            if kind == "DELETED":
                self._pods.pop(key, None)
                self._went(key)
            else:
                self._pods[key] = pod
                self._note_failed(key, pod)
            if kind == "DELETED" or pod.node:
                self._binds.pop(key, None)
            self._note(version(rv))
            self._changed.notify_all()

    def lost(self) -> None:
        """The watch stopped for good (the daemon stops): nothing is answered from here."""
        with self._changed:
            self._seen = -1
            self._changed.notify_all()

    def _note_failed(self, key: tuple[str, str], pod: PodStatus) -> None:
        if pod.deleting:
            self._went(key)
        elif pod.companion and pod.phase == PodPhase.FAILED and key not in self._failed:
            self._failed[key] = (pod, None)

    def _went(self, key: tuple[str, str]) -> None:
        if (kept := self._failed.get(key)) is not None and kept[1] is None:
            self._failed[key] = (kept[0], self.monotonic())

    def _note(self, seen: int | None) -> None:
        if seen is None:
            self._usable = False
        else:
            self._seen = max(self._seen, seen)

    # -- from the daemon ----------------------------------------------------------------------

    def wrote(self, rv: object) -> None:
        """The version a write of ours answered with: later reads must see at least it."""
        written = version(rv)
        with self._changed:
            if written is None:
                return  # a Status (a bind's answer): the pod's next event carries the change
            self._written = max(self._written, written)

    def bound(self, namespace: str, name: str, node: str) -> None:
        """A bind of ours succeeded: the pod reads as on `node` until its event comes."""
        with self._changed:
            self._binds[(namespace, name)] = node

    def pods(self) -> list[PodStatus] | None:
        """Every pod, once the cache has seen this process's writes; None when it has not
        within `wait_s`, was never synced, or cannot compare versions."""
        deadline = self.monotonic() + self.wait_s
        with self._changed:
            while self._usable and (self._seen < 0 or self._seen < self._written):
                left = deadline - self.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            if not self._usable or self._seen < 0 or self._seen < self._written:
                self.fallbacks += 1
                return None
            self.reads += 1
            pods = dict(self._pods)
            for key, node in self._binds.items():
                if (pod := pods.get(key)) is not None and not pod.node:
                    pods[key] = replace(pod, node=node)
            return list(pods.values())

    def failed_gone(self) -> list[PodStatus]:
        """The companion pods seen Failed that went (deleting, or deleted) in the last
        `FAILED_GONE_S`, as they were when seen Failed."""
        now = self.monotonic()
        with self._changed:
            for key in [
                k
                for k, (_, went) in self._failed.items()
                if went is not None and now - went > FAILED_GONE_S
            ]:
                del self._failed[key]
            return [pod for pod, went in self._failed.values() if went is not None]


class NodeInformer:
    def __init__(self, wait_s: float = 2.0) -> None:
        self.wait_s = wait_s
        self._nodes: dict[str, NodeInfo] = {}
        self._versions: dict[str, int] = {}  # node -> the version its entry is as of
        self._live = False  # synced, and its stream has not ended since
        self._usable = True  # False once a version was not a number
        self._first = True  # the first read waits for the first list; no other read waits
        self._lock = threading.Condition()
        self.reads = self.fallbacks = 0  # answered from the cache / left to a list

    # -- from the watch's thread ---------------------------------------------------------------

    def synced(self, nodes: list[NodeInfo], rv: str) -> None:
        """A list: the cache replaced whole, every node as of the list's version `rv`."""
        seen = version(rv)
        with self._lock:
            self._nodes = {n.name: n for n in nodes}
            self._versions = dict.fromkeys(self._nodes, seen if seen is not None else -1)
            self._usable = self._usable and seen is not None
            self._live = True
            self._lock.notify_all()

    def changed(self, kind: str, node: NodeInfo, rv: object) -> None:
        """One event, or the answer of one of the daemon's writes: kept unless the cache
        holds a newer version of the node."""
        seen = version(rv)
        with self._lock:
            if seen is None:
                self._usable = False
                return
            if seen < self._versions.get(node.name, -1):
                return  # older than what a write of ours answered
            if kind == "DELETED":
                self._nodes.pop(node.name, None)
            else:
                self._nodes[node.name] = node
            self._versions[node.name] = seen

    def lapsed(self) -> None:
        """The stream ended: nothing is answered until the next list."""
        with self._lock:
            self._live = False

    def wait_listed(self, timeout_s: float) -> bool:
        """Whether the watch has listed the nodes (and still streams), waiting up to
        `timeout_s` for it (a benchmark's warm-up)."""
        with self._lock:
            return self._lock.wait_for(lambda: self._live, timeout_s)

    # -- from the daemon ----------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo] | None:
        """Every node while the watch is live; None otherwise (the caller lists). The first
        read waits up to `wait_s` for the watch's first list (the daemon's first cycle then
        lists once, not twice); no later read waits, so a node watch that cannot list (a
        403, an outage) costs a cycle nothing beyond the list it made before."""
        with self._lock:
            if self._first:
                self._first = False
                self._lock.wait_for(lambda: self._live or not self._usable, self.wait_s)
            if not (self._live and self._usable):
                self.fallbacks += 1
                return None
            self.reads += 1
            return list(self._nodes.values())
