"""Start, wait for and stop etcd, kube-apiserver, kube-controller-manager and kube-scheduler.

Every process listens on loopback ports picked at start and writes its log under the data
folder. `state.json` there names the processes and ports, so that `python -m devcluster down`
from another shell (or a test run's teardown) stops what `up` started.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devcluster import certs
from devcluster.versions import binary

READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0
SERVICE_RANGE = "10.0.0.0/24"
# kube-scheduler's client-side rate here (--kube-api-qps, --kube-api-burst): the benchmarks give
# Gantry's Kubernetes backend the same (GANTRY_K8S_API_QPS, _BURST).
SCHEDULER_QPS, SCHEDULER_BURST = 500, 1000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class State:
    etcd_port: int
    etcd_peer_port: int
    apiserver_port: int
    pids: dict[str, int] = field(default_factory=dict)


class ControlPlane:
    """One control plane in one data folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder.resolve()
        self.pki = certs.Pki(self.folder / "pki")
        self.state: State | None = self._load()
        # The processes this object started, kept so that they are reaped when stopped (a
        # dropped Popen of a live process is a ResourceWarning, an error in the tests).
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._controllers: str | None = None  # the controller manager's, once started here

    # -- where things are -------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig (system:masters)."""
        return self.folder / "kubeconfig"

    @property
    def url(self) -> str:
        assert self.state is not None, "the control plane is not started"
        return f"https://127.0.0.1:{self.state.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        assert self.state is not None, "the control plane is not started"
        return f"http://127.0.0.1:{self.state.etcd_port}"

    def log(self, name: str) -> Path:
        return self.folder / "logs" / f"{name}.log"

    # -- lifecycle -------------------------------------------------------------------------

    def start(
        self,
        *,
        controller_manager: bool = True,
        scheduler: bool = False,
        controllers: str = "*",
        timeout_s: float = READY_TIMEOUT_S,
    ) -> ControlPlane:
        if self.running():
            raise RuntimeError(f"a control plane already runs in {self.folder}")
        certs.ensure(self.pki.folder)
        (self.folder / "logs").mkdir(parents=True, exist_ok=True)
        self.state = State(free_port(), free_port(), free_port())
        for name in certs.CLIENTS:
            self._write_kubeconfig(name)
        try:
            self._spawn("etcd", self._etcd_args())
            self._wait(self._etcd_ready, "etcd", timeout_s)
            self._spawn("kube-apiserver", self._apiserver_args())
            self._wait(self._apiserver_ready, "kube-apiserver", timeout_s)
            if controller_manager:
                self._controllers = controllers
                self._spawn("kube-controller-manager", self._controller_manager_args(controllers))
            if scheduler:
                self.start_scheduler()
        except BaseException:
            self.stop()
            raise
        return self

    def start_scheduler(self) -> None:
        self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={self.folder / 'kubeconfig-scheduler'}",
                "--leader-elect=false",
                "--secure-port=0",
                f"--kube-api-qps={SCHEDULER_QPS}",
                f"--kube-api-burst={SCHEDULER_BURST}",
            ],
        )

    def stop_process(self, name: str) -> None:
        assert self.state is not None
        pid = self.state.pids.pop(name, None)
        if pid is not None:
            _terminate(pid)
            self._save()
        process = self._processes.pop(name, None)
        if process is not None:
            process.wait()

    def restart_apiserver(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Stop the API server and start it again on the same port (watches must recover)."""
        self.stop_process("kube-apiserver")
        self._spawn("kube-apiserver", self._apiserver_args())
        self._wait(self._apiserver_ready, "kube-apiserver", timeout_s)
        self.revive_controller_manager()

    def revive_controller_manager(self) -> bool:
        """Start the controller manager again if it exited, as a kubelet restarts a crashed
        static pod: one that loses the API server early in its start gives up for good, and
        then nothing makes a namespace's service account (admission refuses every pod)."""
        assert self.state is not None
        pid = self.state.pids.get("kube-controller-manager")
        if pid is None or _alive(pid) or self._controllers is None:
            return False
        self.stop_process("kube-controller-manager")  # reaps the exited one
        self._spawn("kube-controller-manager", self._controller_manager_args(self._controllers))
        return True

    def stop(self) -> None:
        if self.state is None:
            return
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            self.stop_process(name)
        with contextlib.suppress(FileNotFoundError):
            (self.folder / "state.json").unlink()
        self.state = None

    def running(self) -> bool:
        return self.state is not None and any(_alive(p) for p in self.state.pids.values())

    # -- operations tests need ---------------------------------------------------------------

    def compact(self) -> int:
        """Compact etcd at its current revision. A watch from an older version gets 410 Gone
        once the API server's watch cache no longer holds it (after `restart_apiserver`, or
        when the cache's window has moved on); until then the cache still serves it."""
        header = self._etcd_post("/v3/kv/range", {"key": base64.b64encode(b"\0").decode()})
        revision = int(header["header"]["revision"])
        self._etcd_post("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    # -- the processes -------------------------------------------------------------------------

    def _etcd_args(self) -> list[str]:
        assert self.state is not None
        client = f"http://127.0.0.1:{self.state.etcd_port}"
        peer = f"http://127.0.0.1:{self.state.etcd_peer_port}"
        return [
            "--name=default",
            f"--data-dir={self.folder / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync",  # a throwaway store: durability is not what it is for
            "--quota-backend-bytes=8589934592",
            "--log-level=warn",
        ]

    def _apiserver_args(self) -> list[str]:
        assert self.state is not None
        cert, key = self.pki.serving
        sa_pub, sa_key = self.pki.service_account
        return [
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.state.apiserver_port}",
            f"--cert-dir={self.folder / 'pki'}",
            f"--tls-cert-file={cert}",
            f"--tls-private-key-file={key}",
            f"--client-ca-file={self.pki.ca}",
            "--authorization-mode=Node,RBAC",
            # PodSecurity, not this switch, must be what refuses a privileged pod in a
            # restricted namespace: the test of that would prove nothing otherwise.
            "--allow-privileged=true",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            "--profiling=false",
            # The `kubernetes` service's endpoint would be 127.0.0.1, which the reconciler
            # refuses (loopback); nothing here needs that service to route.
            "--endpoint-reconciler-type=none",
            # Without a grace period for watches, SIGTERM leaves the server waiting on the
            # controller manager's open watches until it is killed: a restart took the whole
            # stop timeout.
            "--shutdown-watch-termination-grace-period=1s",
        ]

    def _controller_manager_args(self, controllers: str) -> list[str]:
        sa_key = self.pki.service_account[1]
        kubeconfig = self.folder / "kubeconfig-controller-manager"
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--secure-port=0",
            f"--controllers={controllers}",
            f"--service-account-private-key-file={sa_key}",
            f"--root-ca-file={self.pki.ca}",
            "--use-service-account-credentials=true",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
        ]

    def _spawn(self, name: str, args: list[str]) -> None:
        assert self.state is not None
        path = binary(name)
        if not path.is_file():
            raise RuntimeError(f"{path} is missing: run `python -m devcluster build` first")
        with open(self.log(name), "ab") as log:
            process = subprocess.Popen(
                [str(path), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # outlives `devcluster up`; stopped by pid
            )
        self.state.pids[name] = process.pid
        self._processes[name] = process
        self._save()

    def _wait(self, ready: Any, name: str, timeout_s: float) -> None:
        assert self.state is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _alive(self.state.pids[name]):
                raise RuntimeError(f"{name} exited: see {self.log(name)}\n{_tail(self.log(name))}")
            if ready():
                return
            time.sleep(0.5)
        raise TimeoutError(f"{name} not ready after {timeout_s:.0f} s: see {self.log(name)}")

    def _etcd_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as answer:
                return bool(json.loads(answer.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def _apiserver_ready(self) -> bool:
        try:
            with self.request("/readyz", timeout=2) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def request(self, path: str, timeout: float = 10) -> Any:
        """A GET as the admin, for health checks and tests that want the raw answer."""
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        cert, key = self.pki.client("admin")
        context.load_cert_chain(str(cert), str(key))
        return urllib.request.urlopen(self.url + path, timeout=timeout, context=context)

    def _etcd_post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.etcd_url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            result: dict[str, Any] = json.loads(answer.read())
            return result

    def _write_kubeconfig(self, name: str) -> None:
        cert, key = self.pki.client(name)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gantry-dev",
                    "cluster": {"server": self.url, "certificate-authority": str(self.pki.ca)},
                }
            ],
            "users": [
                {"name": name, "user": {"client-certificate": str(cert), "client-key": str(key)}}
            ],
            "contexts": [{"name": name, "context": {"cluster": "gantry-dev", "user": name}}],
            "current-context": name,
        }
        path = self.kubeconfig if name == "admin" else self.folder / f"kubeconfig-{name}"
        path.write_text(json.dumps(config, indent=2))  # JSON is YAML: every client reads it
        path.chmod(0o600)

    def _save(self) -> None:
        assert self.state is not None
        (self.folder / "state.json").write_text(json.dumps(asdict(self.state)))

    def _load(self) -> State | None:
        try:
            return State(**json.loads((self.folder / "state.json").read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A child that exited but was not reaped is a zombie: not alive for our purposes.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def stop_child(process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop a process this one started: SIGTERM, then SIGKILL after `timeout_s`; reaped."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _terminate(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.05)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""
