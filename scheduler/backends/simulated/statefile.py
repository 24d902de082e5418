"""The simulated cluster's state in a file, so that its pods outlive the scheduler's process.

A real cluster's pods keep running while the scheduler restarts or fails over; the simulated
cluster used to live only in the daemon's memory, so every restart made every pod vanish and
the daemon failed their jobs with "node lost". `PersistentCluster` keeps the state (pods,
node failures and partitions, cordons, pods told never to start) in one file that every
process using it shares:

- each call takes an exclusive `flock` on `<file>.lock` (processes) and a lock (threads);
- it reads the file again when another process replaced it since (its inode changes with
  every write: a new file is renamed over the old one, so a reader never sees half of one);
- a call that changed the state writes it back before the lock is released.

Times are the cluster's clock (wall-clock time in `make run`), so a pod that was due to end
while no scheduler ran has ended when the next one looks, as on a real cluster. Injected
faults and call counts are per process (test tooling) and not kept, but for one: an outage of
the whole cluster (`lose`, `restore`), which every process using the file sees (a marker file
beside it), as every client of an API server that stopped answering does. Its pods go on
running meanwhile; an `observer` (a test harness) sees the cluster through it.

The file holds pickled dataclasses of this module's own making, written and read by the
same installation: it is a cache of a simulation, not an interchange format. One that cannot
be read (written by another version, or damaged) is set aside as `<file>.unreadable` and the
cluster starts empty, saying so in the log.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pickle
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from scheduler.backends.base import (
    BackendError,
    DeviceUtilization,
    FailureReason,
    NodeInfo,
    PodRequest,
    PodStatus,
)
from scheduler.backends.simulated.cluster import SimulatedCluster

log = logging.getLogger("gantry.simulated")

FORMAT = 1  # raised whenever what is pickled changes shape


class PersistentCluster(SimulatedCluster):
    """A `SimulatedCluster` whose state lives in `path` (see the module docstring)."""

    def __init__(
        self, nodes: Sequence[NodeInfo], path: Path, *, observer: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(nodes, **kwargs)
        self.path = Path(path)
        self.observer = observer  # sees the cluster through an outage (`lose`)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._shared_lock = threading.RLock()
        self._seen: tuple[int, int] | None = None  # (inode, mtime) of the file last read
        self._written = b""
        self._depth = 0
        with self._shared():  # adopt what an earlier process left
            pass

    # --- the file ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _shared(self) -> Iterator[None]:
        with self._shared_lock:
            if self._depth:  # a call within a call: the file is ours already
                yield
                return
            with self.path.with_suffix(self.path.suffix + ".lock").open("a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self._depth += 1
                try:
                    self._load_if_changed()
                    yield
                    self._save_if_changed()
                finally:
                    self._depth -= 1
                    fcntl.flock(lock, fcntl.LOCK_UN)

    def _stamp(self) -> tuple[int, int] | None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return None
        return stat.st_ino, stat.st_mtime_ns

    def _state(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "pods": self._pods,
            "stuck": self._stuck,
            "nodes": {
                name: (node.failed_at, node.partitioned_at, node.info.unschedulable)
                for name, node in self._nodes.items()
            },
        }

    def _load_if_changed(self) -> None:
        stamp = self._stamp()
        if stamp is None or stamp == self._seen:
            return
        data = self.path.read_bytes()
        try:
            state = pickle.loads(data)  # noqa: S301 - our own file (module docstring)
            if state.get("format") != FORMAT:
                raise ValueError(f"format {state.get('format')}, not {FORMAT}")
        except Exception as error:  # any damage: set it aside, start empty
            aside = self.path.with_suffix(self.path.suffix + ".unreadable")
            os.replace(self.path, aside)
            log.warning("simulated cluster state %s unreadable (%s): moved to %s, starting empty",
                        self.path, error, aside)  # fmt: skip
            self._seen = None
            return
        with self._lock:
            self._pods = state["pods"]
            self._stuck = state["stuck"]
            for name, (failed_at, partitioned_at, unschedulable) in state["nodes"].items():
                node = self._nodes.get(name)
                if node is None:  # no longer in the inventory this process was given
                    continue
                node.failed_at, node.partitioned_at = failed_at, partitioned_at
                node.info = replace(node.info, unschedulable=unschedulable)
            self._on_node = {}
            for name, pod in self._pods.items():
                if pod.node is not None:
                    self._on_node.setdefault(pod.node, set()).add(name)
        self._seen, self._written = stamp, data

    def _save_if_changed(self) -> None:
        with self._lock:
            data = pickle.dumps(self._state(), protocol=pickle.HIGHEST_PROTOCOL)
        if data == self._written:
            return
        temporary = self.path.with_suffix(self.path.suffix + f".{os.getpid()}.tmp")
        with temporary.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        self._seen, self._written = self._stamp(), data

    # --- an outage of the whole cluster -------------------------------------------------------

    @property
    def _outage_marker(self) -> Path:
        return self.path.with_suffix(self.path.suffix + ".unreachable")

    def lose(self, stall_s: float = 2.0) -> None:
        """From now until `restore`, every API call of every process using this cluster (an
        observer's excepted) stalls `stall_s`, then fails with a BackendError, as a call to an
        API server that stopped answering times out: never a clean, empty answer."""
        temporary = self._outage_marker.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(f"{stall_s}\n")
        os.replace(temporary, self._outage_marker)

    def restore(self) -> None:
        """The API server answers again, with what the cluster ran meanwhile."""
        self._outage_marker.unlink(missing_ok=True)

    def stall_point(self, method: str) -> None:
        """An injected stall (`stall`), then the outage's, before the file lock: a silent
        cluster holds no lock that another process's calls would wait on."""
        super().stall_point(method)
        if self.observer or self._depth:  # an observer, or the second look of one call
            return
        try:
            stall_s = float(self._outage_marker.read_text())
        except (FileNotFoundError, ValueError):
            return
        time.sleep(stall_s)
        raise BackendError(f"{method}: the cluster's API server did not answer in {stall_s:g} s")

    # --- every call that reads or changes the state, through the file ------------------------
    # A stalled API call (`stall`) stalls before the file lock: what runs meanwhile (another
    # daemon, in this process or another) may use the cluster.

    def list_nodes(self) -> Sequence[NodeInfo]:
        self.stall_point("list_nodes")
        with self._shared():
            return super().list_nodes()

    def set_node_unschedulable(self, node: str, unschedulable: bool) -> None:
        self.stall_point("set_node_unschedulable")
        with self._shared():
            super().set_node_unschedulable(node, unschedulable)

    def fail_node(self, node: str, message: str = "node stopped responding") -> None:
        with self._shared():
            super().fail_node(node, message)

    def fail_pod(self, name: str, reason: FailureReason, message: str = "") -> None:
        with self._shared():
            super().fail_pod(name, reason, message)

    def vanish_pod(self, name: str) -> None:
        with self._shared():
            super().vanish_pod(name)

    def heal_node(self, node: str) -> None:
        with self._shared():
            super().heal_node(node)

    def partition_node(self, node: str) -> None:
        with self._shared():
            super().partition_node(node)

    def never_start(self, job_id: int, *args: Any, **kwargs: Any) -> None:
        with self._shared():
            super().never_start(job_id, *args, **kwargs)

    def node_failed(self, node: str) -> bool:
        with self._shared():
            return super().node_failed(node)

    def create_pod(self, pod: PodRequest) -> None:
        self.stall_point("create_pod")
        with self._shared():
            super().create_pod(pod)

    def bind_pod(self, namespace: str, name: str, node: str) -> None:
        self.stall_point("bind_pod")
        with self._shared():
            super().bind_pod(namespace, name, node)

    def delete_pod(self, namespace: str, name: str, grace_period_s: int = 30) -> None:
        self.stall_point("delete_pod")
        with self._shared():
            super().delete_pod(namespace, name, grace_period_s)

    def list_pods(self) -> Sequence[PodStatus]:
        self.stall_point("list_pods")
        with self._shared():
            return super().list_pods()

    def device_readings(self) -> Sequence[DeviceUtilization]:
        self.stall_point("device_readings")
        with self._shared():
            return super().device_readings()

    def next_event_at(self) -> float | None:
        with self._shared():
            return super().next_event_at()
