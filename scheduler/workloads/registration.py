"""The MutatingWebhookConfiguration that sends Gantry the workloads created in Kubernetes.

`configuration(client_config)` renders it; platform/k8s/24-webhook.yaml ships the same with
`service_client()` (a test holds them equal), and the tests on a real API server register it
with `url_client()` pointing at a webhook on loopback.

The choices (docs/kubernetes-native.md, "Admission"):
- CREATE of the kinds in `kinds.KINDS` only: an update, a delete or another kind never waits
  on Gantry;
- only in namespaces labelled app.kubernetes.io/managed-by=gantry (a project's): the API
  server does not call for any other, so a namespace Gantry does not manage is left alone;
- failurePolicy Fail: while the webhook is down, a create in a managed namespace is refused
  ("failed calling webhook"), because an object let through unsuspended would run outside
  quotas, approvals and billing; the user retries. Kueue makes the same choice;
- timeoutSeconds 5, sideEffects None (dry runs are mutated alike), admissionReviewVersions
  [v1], matchPolicy Equivalent (a kind created through another version of its API is still
  sent), reinvocationPolicy Never (the patch holds whatever later webhooks add: they cannot
  unsuspend, and a schedulerName they set is ours to override only once).
"""

from __future__ import annotations

from typing import Any

from scheduler.workloads.kinds import KINDS

Obj = dict[str, Any]

NAME = "gantry-workloads"
WEBHOOK = "workloads.gantry.io"
MANAGED_NAMESPACES = {"app.kubernetes.io/managed-by": "gantry"}
TIMEOUT_S = 5
SERVICE = ("gantry-system", "gantry-webhook")
PATH = "/mutate"


def service_client(ca_bundle: str | None = None, port: int = 443) -> Obj:
    """In the cluster: the gantry-webhook Service (its CA injected, or given as base64 PEM)."""
    namespace, name = SERVICE
    client: Obj = {"service": {"namespace": namespace, "name": name, "path": PATH, "port": port}}
    if ca_bundle is not None:
        client["caBundle"] = ca_bundle
    return client


def url_client(url: str, ca_bundle: str) -> Obj:
    """Outside the cluster (the tests' webhook on loopback): a URL and the CA that signed it."""
    return {"url": url, "caBundle": ca_bundle}


def rules() -> list[Obj]:
    """One rule per API group and version, its kinds' resources, CREATE only."""
    by_api: dict[tuple[str, str], list[str]] = {}
    for kind in KINDS.values():
        by_api.setdefault((kind.group, kind.version), []).append(kind.plural)
    return [
        {
            "apiGroups": [group],
            "apiVersions": [version],
            "resources": sorted(plurals),
            "operations": ["CREATE"],
            "scope": "Namespaced",
        }
        for (group, version), plurals in sorted(by_api.items())
    ]


def configuration(client_config: Obj, *, name: str = NAME) -> Obj:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "gantry"}},
        "webhooks": [
            {
                "name": WEBHOOK,
                "clientConfig": client_config,
                "rules": rules(),
                "namespaceSelector": {"matchLabels": dict(MANAGED_NAMESPACES)},
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "reinvocationPolicy": "Never",
                "sideEffects": "None",
                "timeoutSeconds": TIMEOUT_S,
                "admissionReviewVersions": ["v1"],
            }
        ],
    }
