"""The cluster as the daemon writes to it: every call fenced by the lease first, and
transient backend errors retried with bounded, jittered backoff."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from scheduler.backends.base import BackendError, ClusterBackend, PodRequest
from scheduler.daemon.lease import LeaseKeeper
from scheduler.daemon.state import Clock

log = logging.getLogger("gantry.daemon")


class Cluster:
    def __init__(
        self,
        backend: ClusterBackend,
        keeper: LeaseKeeper,
        clock: Clock,
        *,
        retries: int = 4,
        backoff_s: float = 0.05,
        jitter: Callable[[], float] | None = None,
    ) -> None:
        self.backend, self.keeper, self.clock = backend, keeper, clock
        self.retries, self.backoff_s = retries, backoff_s
        self.jitter = jitter or random.Random().random  # noqa: S311 - jitter

    def call(self, call: Callable[[], None], what: str) -> None:
        """Retry transient backend errors; re-raise the last. Every try is fenced first
        (`LeaseKeeper.fence_cluster_write`): LeaseLost, and nothing sent, once this daemon
        no longer leads."""
        for attempt in range(self.retries):
            self.keeper.fence_cluster_write()
            try:
                call()
                return
            except BackendError as error:
                if attempt + 1 == self.retries:
                    raise
                delay = error.retry_after_s or self.backoff_s * (2**attempt)
                delay = min(delay, 5.0) * (0.5 + self.jitter())
                log.info("backend %s failed (%s); retrying in %.2fs", what, error, delay)
                self.clock.sleep(delay)

    def create(self, pod: PodRequest) -> None:
        self.call(lambda: self.backend.create_pod(pod), "create")

    def bind(self, namespace: str, name: str, node: str) -> None:
        self.call(lambda: self.backend.bind_pod(namespace, name, node), "bind")

    def delete_pods(self, deletions: list[tuple[str, str, int]]) -> None:
        """Delete each (namespace, pod, grace seconds); a failure is logged, and reconcile
        deletes the pod on a later cycle."""
        for namespace, name, grace in deletions:

            def delete(namespace: str = namespace, name: str = name, grace: int = grace) -> None:
                self.backend.delete_pod(namespace, name, grace)

            try:
                self.call(delete, "delete")
            except BackendError as error:
                log.warning("could not delete pod %s/%s: %s", namespace, name, error)

    def set_unschedulable(self, node: str, unschedulable: bool) -> None:
        """Cordon or uncordon `node` in the cluster, fenced (not retried: the next sync
        mirrors the cordons again)."""
        self.keeper.fence_cluster_write()
        self.backend.set_node_unschedulable(node, unschedulable)
