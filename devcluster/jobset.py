"""JobSet's controller manager beside a devcluster plane: a JobSet makes its Jobs (issue 37).

Built from its Go module as a peer (`python -m devcluster build --peers`). It runs as a local
process on loopback: its webhook server serves the plane's own loopback certificate (signed by
the plane's CA, which the API server then trusts as the webhooks' caBundle), and the JobSet
webhooks of its release (config/components/webhook/manifests.yaml in the module) are registered
with the API server by URL. Without its defaulting webhook the controller dereferences the
defaults it expects (success policy, network) and panics; its Pod webhooks are left out, as an
install scopes them to JobSet's own pods, and here they would hold every pod in the plane.
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
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from devcluster import crds
from devcluster.plane import ControlPlane, free_port
from devcluster.versions import binary

READY_TIMEOUT_S = 60.0
WEBHOOKS = "config/components/webhook/manifests.yaml"


@contextlib.contextmanager
def running(plane: ControlPlane, api: client.ApiClient) -> Iterator[subprocess.Popen[bytes]]:
    """JobSet's CRD installed, its manager started and its webhooks registered; stopped (and
    the webhooks removed: they fail every JobSet create without it) on leaving."""
    path = binary("jobset")
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: run `python -m devcluster build --peers` first")
    crds.install(api, ["JobSet"])
    folder = plane.folder / "jobset"
    webhook_port, health_port = free_port(), free_port()
    config = _configure(plane, folder, webhook_port, health_port)
    with open(plane.log("jobset"), "ab") as log:
        process = subprocess.Popen(
            [str(path), f"--kubeconfig={plane.kubeconfig}", f"--config={config}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    names: list[tuple[str, str]] = []
    try:
        _wait_ready(process, health_port, plane.log("jobset"))
        names = _register_webhooks(api, plane, webhook_port)
        yield process
    finally:
        _unregister(api, names)
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _configure(plane: ControlPlane, folder: Path, webhook_port: int, health_port: int) -> Path:
    certs = folder / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    cert, key = plane.pki.serving  # for 127.0.0.1, signed by the plane's CA
    shutil.copyfile(cert, certs / "tls.crt")
    shutil.copyfile(key, certs / "tls.key")
    config = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
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


def _wait_ready(process: subprocess.Popen[bytes], health_port: int, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"jobset exited ({process.returncode}): see {log}")
        try:
            url = f"http://127.0.0.1:{health_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"jobset not ready after {READY_TIMEOUT_S:.0f} s: see {log}")


def _register_webhooks(
    api: client.ApiClient, plane: ControlPlane, port: int
) -> list[tuple[str, str]]:
    """The release's JobSet webhooks, pointed at the manager on loopback."""
    module = crds.go_download("sigs.k8s.io/jobset", crds.KINDS["JobSet"].release)
    ca = base64.b64encode(plane.pki.ca.read_bytes()).decode()
    admission: Any = client.AdmissionregistrationV1Api(api)
    names = []
    for doc in yaml.safe_load_all((module / WEBHOOKS).read_text()):
        if not doc:
            continue
        doc["metadata"] = {"name": f"devcluster-jobset-{doc['metadata']['name']}"}
        doc["webhooks"] = [w for w in doc["webhooks"] if "jobset" in w["name"]]
        for webhook in doc["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
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
