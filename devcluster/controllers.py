"""The workload kinds' controller managers beside a devcluster plane (issue 37): a JobSet makes
its Jobs, a LeaderWorkerSet its StatefulSets.

Each is built from its Go module as a peer (`python -m devcluster build --peers`) and runs as a
local process on loopback: its webhook server serves the plane's own loopback certificate
(signed by the plane's CA, which the API server then trusts as the webhooks' caBundle), and the
webhooks of its release (the manifests in its module) are registered with the API server by
URL. Without its defaulting webhook a controller dereferences the defaults it expects and
panics. Its Pod webhooks are scoped to its own pods by the label it puts on them, as its
release's installation patches them (an unscoped one would hold every pod in the plane).
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from devcluster import crds
from devcluster.plane import ControlPlane, free_port, stop_child
from devcluster.versions import binary

READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Controller:
    binary: str  # its name in versions.COMMANDS
    config_api: str  # the apiVersion of its manager's Configuration
    webhooks: str  # its webhook manifests, in its module
    pod_label: str  # on each of its pods: its Pod webhooks see only those


CONTROLLERS = {
    "JobSet": Controller(
        "jobset",
        "config.jobset.x-k8s.io/v1alpha1",
        "config/components/webhook/manifests.yaml",
        "jobset.sigs.k8s.io/jobset-name",
    ),
    "LeaderWorkerSet": Controller(
        "lws",
        "config.lws.x-k8s.io/v1alpha1",
        "config/webhook/manifests.yaml",
        "leaderworkerset.sigs.k8s.io/name",
    ),
}


@contextlib.contextmanager
def running(
    plane: ControlPlane, api: client.ApiClient, kind: str
) -> Iterator[subprocess.Popen[bytes]]:
    """The kind's CRD installed, its manager started and its webhooks registered; stopped
    (and the webhooks removed: they would fail every create without it) on leaving."""
    controller = CONTROLLERS[kind]
    path = binary(controller.binary)
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: run `python -m devcluster build --peers` first")
    crds.install(api, [kind])
    folder = plane.folder / controller.binary
    webhook_port, health_port = free_port(), free_port()
    config = _configure(controller, plane, folder, webhook_port, health_port)
    log_path = plane.log(controller.binary)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [str(path), f"--kubeconfig={plane.kubeconfig}", f"--config={config}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    names: list[tuple[str, str]] = []
    try:
        _wait_ready(controller.binary, process, health_port, log_path)
        names = _register_webhooks(api, plane, kind, controller, webhook_port)
        yield process
    finally:
        _unregister(api, names)
        stop_child(process, 15)


def _configure(
    controller: Controller, plane: ControlPlane, folder: Path, webhook_port: int, health_port: int
) -> Path:
    certs = folder / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    cert, key = plane.pki.serving  # for 127.0.0.1, signed by the plane's CA
    shutil.copyfile(cert, certs / "tls.crt")
    shutil.copyfile(key, certs / "tls.key")
    config = {
        "apiVersion": controller.config_api,
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }
    path = folder / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def _wait_ready(name: str, process: subprocess.Popen[bytes], health_port: int, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited ({process.returncode}): see {log}")
        try:
            url = f"http://127.0.0.1:{health_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{name} not ready after {READY_TIMEOUT_S:.0f} s: see {log}")


def _register_webhooks(
    api: client.ApiClient, plane: ControlPlane, kind: str, controller: Controller, port: int
) -> list[tuple[str, str]]:
    """The release's webhooks, pointed at the manager on loopback, its Pod ones scoped."""
    source = crds.KINDS[kind]
    module = crds.go_download(source.module, source.release)
    ca = base64.b64encode(plane.pki.ca.read_bytes()).decode()
    admission: Any = client.AdmissionregistrationV1Api(api)
    names = []
    for doc in yaml.safe_load_all((module / controller.webhooks).read_text()):
        if not doc:
            continue
        doc["metadata"] = {"name": f"devcluster-{controller.binary}-{doc['metadata']['name']}"}
        for webhook in doc["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
            if any("pods" in rule["resources"] for rule in webhook["rules"]):
                selector = {"key": controller.pod_label, "operator": "Exists"}
                webhook["objectSelector"] = {"matchExpressions": [selector]}
        mutating = doc["kind"] == "MutatingWebhookConfiguration"
        create = (
            admission.create_mutating_webhook_configuration
            if mutating
            else admission.create_validating_webhook_configuration
        )
        _unregister(api, [(doc["kind"], doc["metadata"]["name"])])  # a run of ours that died
        _drained(create(doc, _preload_content=False))
        names.append((doc["kind"], doc["metadata"]["name"]))
    return names


def _unregister(api: client.ApiClient, names: list[tuple[str, str]]) -> None:
    admission: Any = client.AdmissionregistrationV1Api(api)
    for kind, name in names:
        delete = (
            admission.delete_mutating_webhook_configuration
            if kind == "MutatingWebhookConfiguration"
            else admission.delete_validating_webhook_configuration
        )
        try:
            _drained(delete(name, _preload_content=False))
        except ApiException as error:
            if error.status != 404:
                raise


def _drained(response: Any) -> None:
    try:
        response.data  # noqa: B018 - read before the connection goes back to the pool
    finally:
        response.release_conn()
