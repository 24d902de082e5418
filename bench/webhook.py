"""What the admission webhook costs: its answer, and a create through a real API server.

    python -m bench.webhook --json out.json [--reviews 2000] [--creates 300] [--no-plane]

1. The decision alone (`scheduler.workloads.mutate.review_response`): microseconds per review
   of a Job, a JobSet of 4 replicated jobs and a Pod.
2. The webhook served over TLS on loopback (`scheduler.workloads.server`): `--reviews` POSTs of
   those reviews over one kept-alive connection, as the API server sends them; p50 and p99 ms.
3. With devcluster's binaries (`make control-plane`), unless --no-plane: a control plane with
   the webhook registered by URL (registration.py, as the tests register it), then `--creates`
   pods created one after another in a managed namespace (each one sent to the webhook) and
   in a namespace Gantry does not manage (never sent); p50 and p99 ms of each create, and of
   the same creates by an exempt user (Gantry's daemon: sent, answered unchanged).
The API server's budget is the configuration's timeoutSeconds (5 s).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import ssl
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devcluster import build, certs
from devcluster.plane import ControlPlane
from scheduler.workloads import kinds, registration
from scheduler.workloads.mutate import review_response
from scheduler.workloads.server import WebhookServer

Obj = dict[str, Any]
POD_SPEC = {"restartPolicy": "Never", "containers": [{"name": "main", "image": "pause:3.10"}]}


def _review(kind: kinds.Kind, spec: Obj, user: str = "alice") -> Obj:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-0000-0000-000000000000",
            "kind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
            "operation": "CREATE",
            "userInfo": {"username": user},
            "object": {"metadata": {"name": "x", "namespace": "team-a"}, "spec": spec},
        },
    }


REVIEWS = {
    "Job": _review(kinds.JOB, {"template": {"spec": POD_SPEC}}),
    "JobSet": _review(
        kinds.JOBSET,
        {
            "replicatedJobs": [
                {"name": f"r{i}", "template": {"spec": {"template": {"spec": POD_SPEC}}}}
                for i in range(4)
            ]
        },
    ),
    "Pod": _review(kinds.POD, dict(POD_SPEC)),
}


def _ms(samples: list[float]) -> Obj:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 3),
        "n": len(ordered),
    }


def _timed(call: Callable[[], Any], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def decision(count: int) -> Obj:
    return {
        name: round(min(_timed(lambda r=review: review_response(r), count)) * 1e6, 1)  # type: ignore[misc]
        for name, review in REVIEWS.items()
    }


def served(pki: certs.Pki, count: int) -> Obj:
    cert, key = pki.serving
    server = WebhookServer(("127.0.0.1", 0), cert, key)
    server.start()
    context = ssl.create_default_context(cafile=str(pki.ca))
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=30)
    bodies = {name: json.dumps(review).encode() for name, review in REVIEWS.items()}

    def post(body: bytes) -> None:
        conn.request(
            "POST", "/mutate?timeout=5s", body=body, headers={"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        response.read()
        assert response.status == 200

    try:
        return {name: _ms(_timed(lambda b=body: post(b), count)) for name, body in bodies.items()}  # type: ignore[misc]
    finally:
        conn.close()
        server.stop()


def through_the_api_server(pki: certs.Pki, count: int) -> Obj:
    from kubernetes import client, config

    folder = Path(tempfile.mkdtemp(prefix="bench-webhook-"))
    plane = ControlPlane(folder).start(controller_manager=False)
    cert, key = pki.serving
    server = WebhookServer(("127.0.0.1", 0), cert, key, exempt_users=["gantry-admin-exempt"])
    server.start()
    try:
        configuration = client.Configuration()
        config.load_kube_config(
            config_file=str(plane.kubeconfig), client_configuration=configuration
        )
        api = client.ApiClient(configuration)
        core: Any = client.CoreV1Api(api)
        admission: Any = client.AdmissionregistrationV1Api(api)
        url = f"https://127.0.0.1:{server.port}{registration.PATH}"
        bundle = base64.b64encode(pki.ca.read_bytes()).decode()
        admission.create_mutating_webhook_configuration(
            registration.configuration(registration.url_client(url, bundle))
        )
        for name, labels in (("managed", registration.MANAGED_NAMESPACES), ("other", {})):
            core.create_namespace({"metadata": {"name": name, "labels": labels}})
            # No controller manager here: the ServiceAccount admission needs its account.
            core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
        _wait_until_gated(core)
        result = {}
        for label, namespace, user in (
            ("managed", "managed", None),
            ("other", "other", None),
            ("managed_exempt_user", "managed", "gantry-admin-exempt"),
        ):
            if user:  # the admin's rights, under a name of its own
                api.set_default_header("Impersonate-User", user)
                api.set_default_header("Impersonate-Group", "system:masters")
            result[label] = _ms(_creates(core, namespace, label, count))
        return result
    finally:
        server.stop()
        plane.stop()


def _wait_until_gated(core: Any) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pod = core.create_namespaced_pod(
            "managed", {"metadata": {"name": "probe"}, "spec": POD_SPEC}, dry_run="All"
        )
        if pod.spec.scheduling_gates:
            return
        time.sleep(0.1)
    raise TimeoutError("the webhook was never called")


def _creates(core: Any, namespace: str, prefix: str, count: int) -> list[float]:
    names = iter(range(count))

    def create() -> None:
        body = {"metadata": {"name": f"{prefix.replace('_', '-')}-{next(names)}"}, "spec": POD_SPEC}
        core.create_namespaced_pod(namespace, body, _preload_content=False).release_conn()

    return _timed(create, count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reviews", type=int, default=2000)
    parser.add_argument("--creates", type=int, default=300)
    parser.add_argument("--no-plane", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    pki = certs.ensure(Path(tempfile.mkdtemp(prefix="bench-webhook-pki-")))
    result: Obj = {
        "decision_us": decision(args.reviews),
        "served_over_tls": served(pki, args.reviews),
    }
    if not args.no_plane and not build.missing():
        result["pod_create_through_api_server"] = through_the_api_server(pki, args.creates)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
