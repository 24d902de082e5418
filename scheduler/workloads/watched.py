"""The workload controller's reads from watches instead of lists (issue 37).

`WatchedHeld` answers the controller's reads (`HeldObjects`: the held pods, Jobs and objects
of the custom kinds) from one cache per kind (`scheduler.backends.kubernetes.held`: a list/watch
loop in a thread of its own, relisted by a read every `relist_s`, whose order rules keep what
the watch saw newer than a list). A pass then costs no call to the API server while nothing
changes. What it writes (events, status annotations) goes through the backend.
"""

from __future__ import annotations

from typing import Any, Protocol

from scheduler.backends.kubernetes.held import HeldCaches, HeldListWatch
from scheduler.workloads.controller import Teller

Obj = dict[str, Any]


class Held(HeldListWatch, Teller, Protocol):
    """What `WatchedHeld` needs of the cluster (the Kubernetes backend provides it)."""

    def read_training_runtime(self, namespace: str, kind: str, name: str) -> Obj | None: ...


class WatchedHeld(HeldCaches):
    """The controller's `HeldObjects` from watches: `list_held_*` read the caches
    (`scheduler.backends.kubernetes.held`), events and status annotations are written through
    the backend. `changed` is set by every change a watch sees, so the controller's loop may
    run its next pass at once. `close()` ends the watches."""

    backend: Held  # made with one (`HeldCaches.__init__`)

    def read_training_runtime(self, namespace: str, kind: str, name: str) -> Obj | None:
        """Read through (a runtime is read once per TrainJob, when it is mirrored)."""
        return self.backend.read_training_runtime(namespace, kind, name)

    def record_event(
        self,
        namespace: str,
        pod: str,
        reason: str,
        message: str,
        warning: bool = False,
        about: tuple[str, str, str] = ("v1", "Pod", ""),
    ) -> None:
        self.backend.record_event(namespace, pod, reason, message, warning, about)

    def annotate(
        self, namespace: str, name: str, about: tuple[str, str, str], annotations: dict[str, str]
    ) -> None:
        self.backend.annotate(namespace, name, about, annotations)
