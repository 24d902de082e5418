"""Raw requests to a real API server for the manifest and RBAC tests: server-side apply of
platform/k8s/ (what `kubectl apply --server-side` sends), the API's answers with their status and
Warning headers (which the typed client drops), and clients that hold a service account's token.

Raw, not the typed client: these tests judge the server's answer itself (a 403 is the result,
not an exception to unwrap), and client v37's models do not round-trip every review object.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, dynamic

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "platform" / "k8s"
# `kubectl apply -f platform/k8s/` reads the top level; the example Secrets and the project
# namespace template are applied by hand (README), and must apply as well.
FOLDERS = (K8S, K8S / "examples", K8S / "templates")
FIELD_MANAGER = "gantry-tests"


@dataclass(frozen=True)
class Manifest:
    path: str  # relative to the repository
    index: int  # the document's place in its file
    doc: dict[str, Any]

    @property
    def id(self) -> str:
        meta = self.doc["metadata"]
        return f"{self.path}#{self.index}:{self.doc['kind']}/{meta['name']}"

    @property
    def namespace(self) -> str | None:
        namespace: str | None = self.doc["metadata"].get("namespace")
        return namespace


def manifests(*files: str) -> list[Manifest]:
    """Every document of platform/k8s/ (or of the named files there), in apply order."""
    found: list[Manifest] = []
    for folder in FOLDERS:
        for path in sorted(folder.glob("*.yaml")):
            if files and path.name not in files:
                continue
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
            found.extend(Manifest(str(path.relative_to(ROOT)), i, d) for i, d in enumerate(docs))
    return found


@dataclass(frozen=True)
class Answer:
    status: int
    warnings: str  # the Warning headers, joined; "" when there were none
    body: dict[str, Any]

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))


def request(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    body: Any = None,
    query: list[tuple[str, str]] | None = None,
    content_type: str = "application/json",
) -> Answer:
    """One request; every answer comes back as an Answer, errors included."""
    params = api.param_serialize(
        method,
        path,
        query_params=query or [],
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*params, _request_timeout=30)
    raw = response.read()
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        parsed = {"message": raw.decode(errors="replace")}
    return Answer(response.status, response.headers.get("Warning") or "", parsed)


class Paths:
    """Each kind's URL, from the server's discovery (so no plural is written by hand)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._dynamic = dynamic.DynamicClient(api)

    def of(self, doc: dict[str, Any], *, name: bool = True) -> str:
        resource = self._dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        meta = doc["metadata"]
        path: str = resource.path(
            name=meta["name"] if name else None, namespace=meta.get("namespace")
        )
        return path


def apply(
    api: client.ApiClient, paths: Paths, doc: dict[str, Any], *, dry_run: bool = False
) -> Answer:
    """Server-side apply, with the server refusing unknown or duplicate fields."""
    query = [("fieldManager", FIELD_MANAGER), ("fieldValidation", "Strict"), ("force", "true")]
    if dry_run:
        query.append(("dryRun", "All"))
    return request(
        api,
        "PATCH",
        paths.of(doc),
        body=doc,
        query=query,
        content_type="application/apply-patch+yaml",
    )


def json_patch(
    api: client.ApiClient, path: str, ops: list[dict[str, Any]], *, dry_run: bool = True
) -> Answer:
    """A JSON patch of the object at `path`, a dry run unless told: every admission step and
    policy runs, nothing is kept."""
    return request(
        api,
        "PATCH",
        path,
        body=ops,
        query=[("dryRun", "All")] if dry_run else [],
        content_type="application/json-patch+json",
    )


def create_pod(api: client.ApiClient, namespace: str, pod: dict[str, Any]) -> Answer:
    """A dry-run create: every admission step (Pod Security included) runs, nothing is kept."""
    return request(
        api,
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        body=pod,
        query=[("dryRun", "All"), ("fieldValidation", "Strict")],
    )


def token_for(api: client.ApiClient, namespace: str, account: str) -> str:
    """A short-lived token of the service account (TokenRequest), as the kubelet mounts one."""
    answer = request(
        api,
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 600},
        },
    )
    assert answer.status == 201, f"TokenRequest for {account}: {answer.status} {answer.message}"
    token: str = answer.body["status"]["token"]
    return token


def client_with_token(api: client.ApiClient, token: str) -> client.ApiClient:
    """A client of the same server that authenticates with `token` only (no client cert)."""
    admin = api.configuration
    configuration = client.Configuration(host=admin.host)
    configuration.ssl_ca_cert = admin.ssl_ca_cert
    configuration.api_key = {"BearerToken": token}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    configuration.retries = False
    return client.ApiClient(configuration)
