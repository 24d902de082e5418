"""The cluster as the daemon writes to it: every call fenced by the lease first. Retries of
transient failures are the backend's own (`scheduler.backends.retry`), which fences each try
of a write with the fence the daemon gives it for the call (`FencedWrites.fenced`).

Writes sent from the call pool's threads (`scheduler.daemon.calls`) are fenced without the
database (`LeaseKeeper.fence_from_thread`): inside `threads_writing()`, which the daemon's
thread holds while it waits for them and renews the lease."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any

from django.conf import settings

from scheduler.backends.base import (
    BackendError,
    BindConflict,
    ClusterBackend,
    FencedWrites,
    PodRequest,
)
from scheduler.daemon.calls import Call, CallPool
from scheduler.daemon.lease import LeaseKeeper

log = logging.getLogger("gantry.daemon")
# How many suspended objects a daemon remembers (`Cluster.suspend_workloads`); one forgotten is
# only suspended again (the patch is idempotent).
SUSPENDED_KEPT = 10_000


class Cluster:
    def __init__(self, backend: ClusterBackend, keeper: LeaseKeeper) -> None:
        self.backend, self.keeper = backend, keeper
        # A call sent outside the bind phase (a suspension, a deletion, an adopted pod's bind)
        # is given up after this long as the bind phase's are (GANTRY_CALL_DEADLINE_S): a
        # deletion is tried again next cycle, a failed bind or suspension is the caller's.
        self.call_deadline_s = float(settings.GANTRY_CALL_DEADLINE_S)
        # Whether the backend fences its own retries (a Protocol check costs microseconds:
        # made once, not per call).
        self._fenced = backend if isinstance(backend, FencedWrites) else None
        self.calls = CallPool.for_backend(backend)
        # The users' objects (namespace, "<plural>/<name>") this daemon suspended and has not
        # admitted since, under the lease's epoch it held then: not suspended again while
        # their pods go (`suspend_workloads`).
        self._suspended: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._suspended_epoch: int | None = None

    @property
    def creates_bound(self) -> bool:
        """Whether the backend creates pods on their node: then nothing is bound after."""
        return bool(getattr(self.backend, "creates_bound", False))

    def call(self, call: Callable[[], None]) -> None:
        """`call` once this daemon is known to lead (`LeaseKeeper.fence_cluster_write`):
        LeaseLost, and nothing sent, otherwise. A backend that fences its own writes checks
        again before each try (a cheap clock read while the lease is fresh)."""
        self.keeper.fence_cluster_write()
        if self._fenced is not None:
            with self._fenced.fenced(self.keeper.fence_cluster_write):
                call()
        else:
            call()

    def create(self, pod: PodRequest) -> None:
        self.admitting(pod)
        self.call(lambda: self.backend.create_pod(pod))

    def admitting(self, pod: PodRequest) -> None:
        """`pod` is about to be created, or its user's object admitted: an object admitted
        runs again, and a later preemption must suspend it again."""
        if pod.workload:
            self._suspended.pop((pod.namespace, pod.workload), None)

    def suspend_workloads(
        self, objects: Iterable[tuple[str, str]], deadline_s: float | None = None
    ) -> dict[tuple[str, str], Exception]:
        """Suspend each user's object (namespace, "<plural>/<name>": a Job, JobSet...) whose
        job stopped, concurrently over the call pool's threads where the backend allows it.
        One this daemon suspended already, and has not admitted since, is not sent again
        (reconcile sees a stopped job's allocations every cycle until its pods are gone).
        Returns the objects whose suspension failed or gave no answer within `deadline_s`
        (logged; suspended again on a later cycle)."""
        epoch = getattr(self.keeper.lease, "epoch", None)
        if epoch != self._suspended_epoch:  # led again: another daemon may have admitted some
            self._suspended.clear()
            self._suspended_epoch = epoch
        todo = [o for o in dict.fromkeys(objects) if o not in self._suspended]
        suspend: Any = getattr(self.backend, "suspend_workload", None)
        if not todo or suspend is None:  # only the Kubernetes backend has users' objects
            return {}
        failed = self._each("suspend", todo, suspend, self.suspend_from_thread, deadline_s)
        for namespace, workload in todo:
            if (namespace, workload) in failed:
                log.warning(
                    "suspending %s failed (tried again next cycle): %s",
                    workload,
                    failed[(namespace, workload)],
                )
                continue
            self._suspended[(namespace, workload)] = None
        while len(self._suspended) > SUSPENDED_KEPT:
            self._suspended.popitem(last=False)
        return failed

    def bind(self, namespace: str, name: str, node: str) -> None:
        self.call(lambda: self.backend.bind_pod(namespace, name, node))

    def delete_pods(
        self, deletions: list[tuple[str, str, int]], deadline_s: float | None = None
    ) -> None:
        """Delete each (namespace, pod, grace seconds): concurrently over the call pool's
        threads where the backend allows it, else one after the other. A failure, or no answer
        within `deadline_s`, is logged, and reconcile deletes the pod on a later cycle."""
        failed = self._each(
            "delete", deletions, self.backend.delete_pod, self.delete_from_thread, deadline_s
        )
        for (namespace, name, _), error in failed.items():
            log.warning("could not delete pod %s/%s: %s", namespace, name, error)

    def bind_pods(
        self, binds: Sequence[tuple[str, str, str]], deadline_s: float | None = None
    ) -> dict[tuple[str, str, str], Exception]:
        """Bind each (namespace, pod, node) of pods that exist already (a user's Job's,
        adopted by their replicas; companions): concurrently where the backend allows it, as
        the bind phase's calls go, else one after the other. Returns the binds that failed
        (BackendError, BindConflict, or no answer within `deadline_s`), for the caller to
        judge; LeaseLost, or a bug, raises."""
        return self._each(
            "bind", list(binds), self.backend.bind_pod, self.bind_named_from_thread, deadline_s
        )

    def _each(
        self,
        step: str,
        items: list[tuple[Any, ...]],
        direct: Callable[..., None],
        from_thread: Callable[..., None],
        deadline_s: float | None,
    ) -> dict[Any, Exception]:
        """`direct(*item)` for each item, fenced, one after the other; or `from_thread(*item)`
        over the call pool's threads where it has more than one, at most `in_flight` at once.
        Returns the items whose call failed as a call may (BackendError, BindConflict) or gave
        no answer within `deadline_s` of its start (a BackendError saying so)."""
        deadline_s = self.call_deadline_s if deadline_s is None else deadline_s
        failed: dict[Any, Exception] = {}
        if not (self.calls.threaded and len(items) > 1):
            for item in items:
                try:
                    self.call(functools.partial(direct, *item))
                except (BackendError, BindConflict) as refused:
                    failed[item] = refused
            return failed
        with self.threads_writing():
            waiting = {
                call.future: call
                for call in (
                    self.calls.send(Call(0, step, item), functools.partial(from_thread, *item))
                    for item in items
                )
            }
            while waiting:
                # Woken for the lease's renewal, or at the first started call's deadline.
                timeout = self.keeper.lease.ttl_s / 12
                started = [c.started for c in waiting.values() if c.started is not None]
                if started:
                    left = min(started) + deadline_s - self.calls.monotonic()
                    timeout = min(timeout, max(0.0, left) + 0.001)
                done, _ = wait(list(waiting), timeout=timeout, return_when=FIRST_COMPLETED)
                self.keeper.keep_for_threads()  # LeaseLost when lost: no thread writes again
                now = self.calls.monotonic()
                late = [
                    f
                    for f, c in waiting.items()
                    if f not in done and c.started is not None and now - c.started >= deadline_s
                ]
                for future in [*done, *late]:
                    item = waiting.pop(future).what
                    if future in late:
                        failed[item] = BackendError(f"no answer within {deadline_s:g} s")
                        continue
                    outcome = future.exception()
                    if isinstance(outcome, BackendError | BindConflict):
                        failed[item] = outcome
                    elif outcome is not None:
                        raise outcome  # LeaseLost, or a bug: the cycle ends here
        return failed

    def set_unschedulable(self, node: str, unschedulable: bool) -> None:
        """Cordon or uncordon `node` in the cluster."""
        self.call(lambda: self.backend.set_node_unschedulable(node, unschedulable))

    # -- from the call pool's threads --------------------------------------------------------

    @contextlib.contextmanager
    def threads_writing(self) -> Iterator[None]:
        """While the daemon's thread waits for writes sent from the pool: every try of each is
        fenced without the database (the backend's fence is the same for every thread)."""
        if self._fenced is None:
            yield
            return
        with self._fenced.fenced(self.keeper.fence_from_thread):
            yield

    def create_from_thread(self, pod: PodRequest) -> None:
        self.keeper.fence_from_thread()
        self.backend.create_pod(pod)

    def suspend_from_thread(self, namespace: str, workload: str) -> None:
        self.keeper.fence_from_thread()
        backend: Any = self.backend  # the Kubernetes backend: only it has users' objects
        backend.suspend_workload(namespace, workload)

    def bind_from_thread(self, pod: PodRequest) -> None:
        self.bind_named_from_thread(pod.namespace, pod.name, pod.node)

    def bind_named_from_thread(self, namespace: str, name: str, node: str) -> None:
        self.keeper.fence_from_thread()
        self.backend.bind_pod(namespace, name, node)

    def delete_from_thread(self, namespace: str, name: str, grace: int) -> None:
        self.keeper.fence_from_thread()
        self.backend.delete_pod(namespace, name, grace)
