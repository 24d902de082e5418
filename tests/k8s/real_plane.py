"""The real control plane that `kubernetes`-marked tests run against (issue 22).

`real_plane` is session-scoped: one per pytest process, so one per xdist worker. Starting a
plane from cached binaries costs a few seconds, less than sharing one between workers would
save after the locking and the cross-talk of two kubelet simulators on one API server.

Where the cluster comes from:
- KUBECONFIG set: that cluster, as it is (`plane` and `kubelets` are None: its nodes are real,
  or played by someone else);
- else the devcluster binaries cached (`make control-plane`): a ControlPlane in the worker's
  temporary folder, with GPU and CPU-only nodes played by `devcluster.kubelets.Kubelets` in a
  background thread;
- else the tests skip, saying why, unless GANTRY_K8S_REAL=required (`make test`), when they
  fail: CI must not pass by skipping them.

GANTRY_K8S_REAL=db-only (the SQLite pass of `make test`) deselects the real-cluster tests that
do not touch the database (the PostgreSQL pass ran them), and the slow tests marked
`backend_independent(why)`: they touch no database at all (their own servers, or a subprocess
whose environment the test sets whole), so the second pass would repeat the first exactly;
=skip deselects all the real-cluster tests.
Other test folders use the fixture by importing it into their conftest.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.watch.watch import iter_resp_lines

from devcluster import build
from devcluster.kubelets import Kubelets, NodeShape
from devcluster.plane import ControlPlane
from devcluster.versions import ROOT

MODE_ENV = "GANTRY_K8S_REAL"
REQUIRED, DB_ONLY, SKIP = "required", "db-only", "skip"
GPU_NODES = ("real-gpu-1", "real-gpu-2")
CPU_NODES = ("real-cpu-1",)
PRIORITY_CLASSES = ROOT / "platform" / "k8s" / "01-priorityclasses.yaml"
# A real server answers within this on an idle machine; CI machines are not idle.
WAIT_S = 60.0

Obj = dict[str, Any]


@dataclass
class RealPlane:
    """What a real-cluster test gets: the admin's kubeconfig and client, the simulated
    kubelets and the plane (None when KUBECONFIG named the cluster)."""

    kubeconfig: Path
    api: client.ApiClient
    kubelets: Kubelets | None
    plane: ControlPlane | None
    gpu_nodes: list[str] = field(default_factory=list)
    cpu_nodes: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        return [*self.gpu_nodes, *self.cpu_nodes]


def mode() -> str:
    return os.environ.get(MODE_ENV, "").strip().lower()


def uses_database(item: Any) -> bool:
    return item.get_closest_marker("django_db") is not None or bool(
        {"db", "transactional_db"} & set(getattr(item, "fixturenames", ()))
    )


def deselect(items: list[Any], config_: Any) -> None:
    """Drop the tests that this pass must not run (GANTRY_K8S_REAL): the real-cluster ones,
    and in the db-only pass those marked `backend_independent` (a marked test that asks for
    the database is a mistake in the marking: an error, never silently dropped)."""
    wanted = mode()
    if wanted not in (DB_ONLY, SKIP):
        return
    keep, drop = [], []
    for item in items:
        real = item.get_closest_marker("kubernetes") is not None
        uses_db = uses_database(item)
        independent = item.get_closest_marker("backend_independent") is not None
        if independent and uses_db:
            raise pytest.UsageError(
                f"{getattr(item, 'nodeid', item)}: backend_independent, but uses the database"
            )
        once = independent and wanted == DB_ONLY
        (drop if once or (real and (wanted == SKIP or not uses_db)) else keep).append(item)
    if drop:
        config_.hook.pytest_deselected(items=drop)
        items[:] = keep


def admin_client(kubeconfig: Path) -> client.ApiClient:
    """A client of its own for the kubeconfig, without urllib3's retries (a test that wants
    retries gets the backend's)."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.retries = False
    return client.ApiClient(configuration)


def apply_priority_classes(api: client.ApiClient) -> None:
    """Gantry's pods name a PriorityClass; the real admission refuses a pod naming none."""
    scheduling: Any = client.SchedulingV1Api(api)
    for doc in yaml.safe_load_all(PRIORITY_CLASSES.read_text()):
        if not doc:
            continue
        try:
            drained(scheduling.create_priority_class(doc, _preload_content=False))
        except client.ApiException as error:
            if error.status != 409:
                raise


def _unavailable(reason: str) -> None:
    if mode() == REQUIRED:
        pytest.fail(f"{MODE_ENV}=required but {reason}", pytrace=False)
    pytest.skip(f"no real control plane: {reason}")


def require_binaries() -> None:
    """Skip (or fail, when required) a test that starts its own plane without the binaries."""
    if mode() == SKIP:
        pytest.skip(f"{MODE_ENV}=skip")
    absent = build.missing()
    if absent:
        _unavailable(
            f"the devcluster binaries of {', '.join(absent)} are not built "
            "(run `make control-plane`, or set KUBECONFIG)"
        )


@pytest.fixture(scope="session")
def real_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealPlane]:
    if mode() == SKIP:
        pytest.skip(f"{MODE_ENV}=skip")
    kubeconfig = os.environ.get("KUBECONFIG")
    if kubeconfig:
        yield from _external(Path(kubeconfig))
        return
    require_binaries()
    folder = tmp_path_factory.mktemp("control-plane")
    try:
        yield from _devcluster(folder)
    finally:
        # etcd preallocates its write-ahead log: do not leave it in the kept temp folders.
        shutil.rmtree(folder / "etcd", ignore_errors=True)


def _external(kubeconfig: Path) -> Iterator[RealPlane]:
    api = admin_client(kubeconfig)
    try:
        apply_priority_classes(api)
        yield RealPlane(kubeconfig, api, None, None, gpu_nodes=_ready_nodes(api))
    finally:
        api.close()


def _ready_nodes(api: client.ApiClient) -> list[str]:
    core: Any = client.CoreV1Api(api)
    names = []
    for node in _json(core.list_node)["items"]:
        conditions = (node.get("status") or {}).get("conditions") or ()
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        if ready and not (node.get("spec") or {}).get("unschedulable"):
            names.append(node["metadata"]["name"])
    return names


def _devcluster(folder: Path) -> Iterator[RealPlane]:
    plane = ControlPlane(folder)
    try:
        plane.start(controller_manager=True)
    except (RuntimeError, TimeoutError) as error:
        _unavailable(f"the control plane did not start: {error}")
    stop = threading.Event()
    thread: threading.Thread | None = None
    api = admin_client(plane.kubeconfig)
    try:
        apply_priority_classes(api)
        kubelets = Kubelets(api)
        kubelets.add_nodes(GPU_NODES, NodeShape())
        kubelets.add_nodes(CPU_NODES, NodeShape(gpus=0, cpu="32", memory="128Gi"))
        thread = threading.Thread(
            target=kubelets.run, args=(stop,), name="devcluster-kubelets", daemon=True
        )
        thread.start()
        yield RealPlane(
            plane.kubeconfig,
            api,
            kubelets,
            plane,
            gpu_nodes=list(GPU_NODES),
            cpu_nodes=list(CPU_NODES),
        )
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=10)
        api.close()
        plane.stop()


# -- talking to a real server --------------------------------------------------------------


def drained(response: Any) -> None:
    """Read an answer we do not need before its connection goes back to the pool: given back
    unread, a large body (a pod list) becomes the next request's status line (BadStatusLine)."""
    try:
        response.data  # noqa: B018 - reading is the point
    finally:
        response.release_conn()


def _json(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
    response = fn(*args, _preload_content=False, **kwargs)
    try:
        result: Obj = json.loads(response.data)
        return result
    finally:
        response.release_conn()


def wait_for_pod(
    api: client.ApiClient,
    namespace: str,
    name: str,
    until: Callable[[Obj | None], bool],
    timeout_s: float = WAIT_S,
) -> Obj | None:
    """The pod once `until(pod)` holds (`pod` is None once it is gone), followed by a watch
    rather than by polling. AssertionError with the pod's last state after `timeout_s`."""
    core: Any = client.CoreV1Api(api)
    return wait_for(core.list_namespaced_pod, namespace, name, until, timeout_s)


def wait_for(
    list_fn: Callable[..., Any],
    namespace: str,
    name: str,
    until: Callable[[Obj | None], bool],
    timeout_s: float = WAIT_S,
) -> Obj | None:
    """wait_for_pod for any namespaced kind, given its list call (`list_namespaced_service`)."""
    selector = f"metadata.name={name}"
    deadline = time.monotonic() + timeout_s
    last: Obj | None = None
    while True:
        listed = _json(list_fn, namespace, field_selector=selector)
        last = (listed.get("items") or [None])[0]
        if until(last):
            return last
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"{namespace}/{name} never got there; last seen: {last}")
        response = list_fn(
            namespace,
            field_selector=selector,
            watch=True,
            resource_version=listed["metadata"]["resourceVersion"],
            timeout_seconds=max(1, int(remaining)),
            _preload_content=False,
            _request_timeout=(10, remaining + 5),
        )
        try:
            for line in iter_resp_lines(response):
                if not line.strip():
                    continue
                event = json.loads(line)
                if event["type"] == "ERROR":
                    break  # 410 Gone after a compaction: list again
                last = None if event["type"] == "DELETED" else event["object"]
                if until(last):
                    return last
        finally:
            response.close()
            response.release_conn()
