"""The objects Gantry's webhook held, as watches see them (issue 37): one cache per kind, each
kept by a list/watch loop in a thread of its own (`ListWatcher`, the loop the daemon's pod
informer runs), so that a read costs no call to the API server while nothing changes. The
workload controller reads every pass from them (`scheduler.workloads.watched.WatchedHeld`), and
so does the daemon's sweep of held objects that run without a live job
(`scheduler.daemon.strays`).

Missed events: a watch can break without ending (a proxy that stops forwarding, an API server
that stops sending): its stream stays open and says nothing. So every `relist_s` of the
reader's clock a read lists the kind again, in the read, and the list replaces the cache (a
read that cannot list raises what the list raised, and the cache stays as it was). Every end
of a stream is also a list (the loop's own), at least every `timeout_s`.

Order: an event no newer than the list the cache holds is dropped (a late event must not
bring back an object the list says is gone), and a list does not undo what the watch saw after
it was taken: a read's list is answered while the watch goes on in its own thread, so a
creation (or deletion) the watch applied between the list's answer and its replacing the cache
would otherwise be lost until the next relist (an object created then was not queued for up to
`relist_s`; one deleted then not cancelled). A kind the API server does not serve (its CRD
not installed) reads as empty and starts no watch; it is listed again at the next relist.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from scheduler.backends.base import BackendError
from scheduler.backends.kubernetes.informer import version
from scheduler.backends.kubernetes.watch import ListFn, ListWatcher, StreamFn

Obj = dict[str, Any]
NOT_FOUND = 404
POD, JOB = ("", "v1", "pods"), ("batch", "v1", "jobs")


@runtime_checkable
class HeldListWatch(Protocol):
    """What the caches need of the cluster (the Kubernetes backend provides it)."""

    def held_list_watch(self, group: str, version: str, plural: str) -> tuple[ListFn, StreamFn]: ...


class HeldCache:
    """One kind's held objects by uid, as its list/watch last saw them."""

    def __init__(
        self,
        list_all: ListFn,
        open_stream: StreamFn,
        *,
        clock: Callable[[], float],
        relist_s: float,
        changed: threading.Event,
        timeout_s: int = 300,
    ) -> None:
        self.list_all, self.clock, self.relist_s, self.changed = list_all, clock, relist_s, changed
        self._objects: dict[str, Obj] = {}
        self._listed_rv = -1  # the version of the list the cache holds
        # uid -> the version of its deletion, as the watch saw it: a list older than that
        # still holds the object, and must not bring it back (`_replace`).
        self._deleted: dict[str, int] = {}
        self._listed_at = -math.inf  # when (controller's clock) a read last listed
        self._lock = threading.Lock()
        self._relisting = threading.Lock()  # one list at a time from the readers
        self.lists = 0  # lists made by reads (not the loop's own)
        self.served = True
        self.watcher = ListWatcher(
            list_all=list_all,
            open_stream=open_stream,
            parse=lambda obj: obj,
            on_sync=self._synced,
            on_event=self._event,
            timeout_s=timeout_s,
            sleep=self._back_off,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def items(self) -> list[Obj]:
        """The held objects: listed first when never listed or `relist_s` since the last
        list (raising what the list raises: nothing is answered from a cache it could not
        check)."""
        if self.clock() - self._listed_at >= self.relist_s:
            self._relist()
        with self._lock:
            return list(self._objects.values())

    def close(self) -> None:
        self._stop.set()
        self.watcher.close()

    def _back_off(self, seconds: float) -> None:  # the loop's wait after a failure; ends on close
        self._stop.wait(seconds)

    def _relist(self) -> None:
        with self._relisting:
            try:
                items, rv = self.list_all()
            except BackendError as error:
                if getattr(error, "status", None) != NOT_FOUND:
                    raise
                items, rv, self.served = [], "", False  # the kind is not served: nothing held
            else:
                self.served = True
            self.lists += 1
            self._replace(items, version(rv))
            self._listed_at = self.clock()
            if self.served and self._thread is None:
                # The loop watches from this list's version: no second list to start.
                self.watcher.resource_version = rv
                self._thread = threading.Thread(
                    target=self.watcher.run,
                    args=(self._stop,),
                    name="gantry-held-watch",
                    daemon=True,
                )
                self._thread.start()

    def _replace(self, items: list[Obj], rv: int | None) -> None:
        """The cache becomes the list of version `rv`, but for what the watch saw after it
        (newer than `rv`): an object it created or changed is kept as it saw it, one it
        deleted stays gone."""
        with self._lock:
            if rv is not None and rv < self._listed_rv:
                return  # the loop's own list, newer, landed meanwhile
            objects = {_uid(o): o for o in items}
            if rv is not None:
                newer = {u: o for u, o in self._objects.items() if (version(_rv(o)) or -1) > rv}
                objects.update(newer)
                self._deleted = {u: gone for u, gone in self._deleted.items() if gone > rv}
                for uid in self._deleted:
                    objects.pop(uid, None)
            self._objects = objects
            self._listed_rv = -1 if rv is None else rv

    # -- from the watch's thread ------------------------------------------------------------

    def _synced(self, items: list[Obj]) -> None:
        self._replace(items, version(self.watcher.resource_version))
        self.changed.set()

    def _event(self, kind: str, obj: Obj) -> None:
        uid, rv = _uid(obj), version(_rv(obj))
        with self._lock:
            if rv is not None and rv <= self._listed_rv:
                return  # the list the cache holds already says what this says, or more
            if kind == "DELETED":
                self._objects.pop(uid, None)
                if rv is not None:
                    self._deleted[uid] = rv
            else:
                self._objects[uid] = obj
        self.changed.set()


def _rv(obj: Obj) -> int | None:
    return version((obj.get("metadata") or {}).get("resourceVersion"))


def _uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid"))


class HeldCaches:
    """The held objects of each kind a reader asks for, each from its cache (`HeldCache`,
    made at the kind's first read). `changed` is set by every change a watch sees, so a
    loop may run its next pass at once. `close()` ends the watches."""

    def __init__(
        self,
        backend: HeldListWatch,
        *,
        clock: Callable[[], float] = time.monotonic,
        relist_s: float = 60.0,
        timeout_s: int = 300,
    ) -> None:
        self.backend, self.clock, self.relist_s, self.timeout_s = (
            backend,
            clock,
            relist_s,
            timeout_s,
        )
        self.changed = threading.Event()
        self.caches: dict[tuple[str, str, str], HeldCache] = {}

    def cache(self, group: str, version: str, plural: str) -> HeldCache:
        key = (group, version, plural)
        if key not in self.caches:
            list_all, open_stream = self.backend.held_list_watch(*key)
            self.caches[key] = HeldCache(
                list_all,
                open_stream,
                clock=self.clock,
                relist_s=self.relist_s,
                changed=self.changed,
                timeout_s=self.timeout_s,
            )
        return self.caches[key]

    def list_held_pods(self) -> list[Obj]:
        return self.cache(*POD).items()

    def list_held_jobs(self) -> list[Obj]:
        return self.cache(*JOB).items()

    def list_held_objects(self, group: str, version: str, plural: str) -> list[Obj]:
        return self.cache(group, version, plural).items()

    def close(self) -> None:
        for cache in self.caches.values():
            cache.close()
