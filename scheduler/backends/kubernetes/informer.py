"""Gantry's pods as the watch has seen them: the informer's cache, from which reconcile reads
instead of listing every pod from the API server every cycle.

The pod watch (`KubernetesBackend.watch_pods`) fills it: a list replaces it whole, each event
changes one pod. Every stream end is a re-list (`ListWatcher`), at least every `timeout_s`:
the periodic relist that catches what a watch could have missed.

Read-your-writes: a cycle must see the pods it created, bound or deleted itself, or reconcile
would judge a pod it just made as vanished. The backend notes the resourceVersion of every
write's answer (`wrote`); `pods()` answers only once the cache has seen events at least that
recent (etcd's versions grow with every write; a version that is not a number makes the cache
unusable, and the backend lists from the API server as before). It waits up to `wait_s` for
the watch to catch up, then gives up (None): the caller lists.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

from scheduler.backends.base import PodStatus


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
            self._note(seen)
            self._changed.notify_all()

    def changed(self, kind: str, pod: PodStatus, rv: str | None) -> None:
        """One event: ADDED or MODIFIED keeps the pod's new state, DELETED drops it."""
        with self._changed:
            key = (pod.namespace, pod.name)
            if kind == "DELETED":
                self._pods.pop(key, None)
            else:
                self._pods[key] = pod
            if kind == "DELETED" or pod.node:
                self._binds.pop(key, None)
            self._note(version(rv))
            self._changed.notify_all()

    def lost(self) -> None:
        """The watch stopped for good (the daemon stops): nothing is answered from here."""
        with self._changed:
            self._seen = -1
            self._changed.notify_all()

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
