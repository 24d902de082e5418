"""The clusters the upgrade test runs on (tests/upgrade/test_upgrade.py): what it needs of
each to start the current tree's daemon on the cluster the old one used, and to tell a pod
that kept running from one started again.

- `SimulatedWorld`: the simulated cluster's state file, shared by the old process and this
  one as a real cluster is by two daemons; a pod's identity is its creation and binding.
- `KubernetesWorld`: the real control plane (tests/k8s/real_plane.py), four GPU nodes of its
  own whose kubelets this process plays in a thread, the session's other nodes cordoned; a
  pod's identity is its uid and creation on the API server.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from devcluster.kubelets import Kubelets, NodeShape
from scheduler.backends.kubernetes.backend import KubernetesBackend
from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.simulated.inventory import make_nodes
from scheduler.backends.simulated.statefile import PersistentCluster
from scheduler.daemon.loop import Daemon
from scheduler.models import Job
from tests.daemon.conftest import FakeClock
from tests.k8s.real_plane import RealPlane, admin_client

PodIds = dict[str, tuple[Any, ...]]
SETTLE_S = 60.0  # the kubelets start a bound pod within a pass or two
UPGRADE_NODES = tuple(f"upgrade-gpu-{i}" for i in range(1, 5))


class SimulatedWorld:
    kind = "simulated"

    def __init__(self, state_file: Path) -> None:
        self.state_file = state_file

    def env(self) -> dict[str, str]:
        return {"GANTRY_SIM_STATE_FILE": str(self.state_file)}

    def backend(self, clock: FakeClock) -> PersistentCluster:
        nodes = make_nodes(4, "H100-80GB", 8, prefix="h100")
        return PersistentCluster(nodes, self.state_file, clock=clock, start_delay_s=1.0,
                                 grace_cap_s=2.0)  # fmt: skip

    def pods(self, clock: FakeClock) -> PodIds:
        cluster = self.backend(clock)
        with cluster._shared():
            return {n: (p.node, p.created_at, p.bound_at) for n, p in cluster._pods.items()}

    def created(self, backend: Any) -> int:
        """Pods this process's cluster object created."""
        return int(backend.calls.get("create_pod", 0))

    def settle(self, daemon: Daemon, clock: FakeClock) -> None:
        for _ in range(2):
            clock.advance(2)
            daemon.step()


class KubernetesWorld:
    kind = "kubernetes"

    def __init__(self, plane: RealPlane) -> None:
        self.plane = plane
        self.api = admin_client(plane.kubeconfig)
        self.core: Any = client.CoreV1Api(self.api)
        self.kubelets = Kubelets(self.api)
        self.stop = threading.Event()

    @contextlib.contextmanager
    def running(self) -> Iterator[KubernetesWorld]:
        """Our nodes up and played, the session's cordoned, for the block; every pod on our
        nodes and the nodes themselves gone afterwards."""
        self.kubelets.add_nodes(UPGRADE_NODES, NodeShape(gpus=8))
        others = [n for n in self.plane.nodes]
        for name in others:
            self._json(self.core.patch_node, name, {"spec": {"unschedulable": True}})
        thread = threading.Thread(target=self.kubelets.run, args=(self.stop,), daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            thread.join(timeout=10)
            for namespace in {p["metadata"]["namespace"] for p in self._pods()}:
                self._json(self.core.delete_collection_namespaced_pod, namespace,
                           grace_period_seconds=0)  # fmt: skip
            for name in UPGRADE_NODES:
                self._json(self.core.delete_node, name)
            for name in others:
                self._json(self.core.patch_node, name, {"spec": {"unschedulable": False}})
            self.api.close()

    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.plane.kubeconfig)}

    def backend(self, clock: FakeClock) -> KubernetesBackend:
        return KubernetesBackend(admin_client(self.plane.kubeconfig), KubernetesConfig())

    def pods(self, clock: FakeClock) -> PodIds:
        return {
            p["metadata"]["name"]: (p["metadata"]["uid"], p["metadata"]["creationTimestamp"])
            for p in self._pods()
        }

    def created(self, backend: Any) -> int:
        return 0  # told by the pods' uids instead (pods())

    def settle(self, daemon: Daemon, clock: FakeClock) -> None:
        deadline = time.monotonic() + SETTLE_S
        placing = Job.objects.filter(state__in=["admitted", "binding"])
        clock.advance(0.5)
        daemon.step()
        while placing.exists() and time.monotonic() < deadline:
            self.kubelets.wait_passes(1, timeout_s=5)
            clock.advance(0.5)
            daemon.step()

    def _pods(self) -> list[dict[str, Any]]:
        items = self._json(self.core.list_pod_for_all_namespaces)["items"]
        return [p for p in items if p["spec"].get("nodeName") in UPGRADE_NODES]

    @staticmethod
    def _json(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        response = fn(*args, _preload_content=False, **kwargs)
        try:
            result: dict[str, Any] = json.loads(response.data)
            return result
        finally:
            response.release_conn()
