"""What a project namespace holds besides its pods: NetworkPolicies and the web's log RoleBinding.

The scheduler daemon creates these with the namespace (`KubernetesBackend.ensure_namespace`),
and again, once per process, for a Gantry namespace it finds already made (an upgrade from a
release without them). platform/k8s/templates/tenant-namespace.yaml is the same set, rendered
for `team-a-vision`; tests/test_platform.py checks that the two agree.

Network (enforced by the cluster's CNI; one without NetworkPolicy support ignores them):
- `gantry-default-deny`: no ingress and no egress for any pod of the namespace, but for
- `gantry-same-namespace`: the namespace's pods reach each other (a gang's MASTER_ADDR);
- `gantry-dns`: the cluster DNS (port 53 of the DNS pods in `dns_namespace`);
- `gantry-egress`: the `egress_cidrs` (the internet by default) except `egress_except`: the
  private ranges (pods, Services, nodes, other tenants, Gantry's web and databases) and the
  link-local range, which holds the cloud metadata address 169.254.169.254. The metadata
  address is excepted whatever is configured.

Logs: a RoleBinding of the ClusterRole `log_reader_role` (pods/log get) to the web's service
account, in this namespace only: the web reads job logs of project namespaces and of no other
(not kube-system's, not Gantry's own).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.kubernetes.render import LABEL_MANAGED

METADATA_ADDRESSES = ("169.254.169.254/32", "fd00:ec2::254/128")
CONFLICT = 409
DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


def _meta(name: str, namespace: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": {LABEL_MANAGED: "gantry"}}


def _policy(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(name, namespace),
        "spec": {"podSelector": {}, **spec},
    }


def egress_blocks(cidrs: tuple[str, ...], excepted: tuple[str, ...]) -> list[dict[str, Any]]:
    """One ipBlock per allowed range, with the excepted ranges that lie inside it (the API
    refuses an `except` outside its `cidr`); the metadata addresses are always excepted."""
    blocks = []
    for cidr in cidrs:
        network = ipaddress.ip_network(cidr, strict=False)
        inside: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for text in (*excepted, *METADATA_ADDRESSES):
            hole = ipaddress.ip_network(text, strict=False)
            if hole.version != network.version or not hole.subnet_of(network):  # type: ignore[arg-type]
                continue
            if hole != network and not any(hole.subnet_of(h) for h in inside):  # type: ignore[arg-type]
                inside.append(hole)
        block: dict[str, Any] = {"cidr": str(network)}
        if inside:
            block["except"] = [str(h) for h in inside]
        blocks.append({"ipBlock": block})
    return blocks


def render_network_policies(namespace: str, config: KubernetesConfig) -> list[dict[str, Any]]:
    """The project namespace's NetworkPolicies (module docstring)."""
    dns_peer = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": config.dns_namespace}},
        "podSelector": {"matchLabels": dict(config.dns_pod_labels)},
    }
    policies = [
        _policy("gantry-default-deny", namespace, {"policyTypes": ["Ingress", "Egress"]}),
        _policy(
            "gantry-same-namespace",
            namespace,
            {
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{"podSelector": {}}]}],
                "egress": [{"to": [{"podSelector": {}}]}],
            },
        ),
        _policy(
            "gantry-dns",
            namespace,
            {"policyTypes": ["Egress"], "egress": [{"to": [dns_peer], "ports": DNS_PORTS}]},
        ),
    ]
    if config.egress_cidrs:
        blocks = egress_blocks(config.egress_cidrs, config.egress_except)
        egress = {"policyTypes": ["Egress"], "egress": [{"to": blocks}]}
        policies.append(_policy("gantry-egress", namespace, egress))
    return policies


def render_log_reader_binding(namespace: str, config: KubernetesConfig) -> dict[str, Any]:
    """The web's pods/log grant in this namespace only (module docstring)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(config.log_reader_role, namespace),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": config.log_reader_role,
        },
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": config.log_reader_account,
                "namespace": config.platform_namespace,
            }
        ],
    }


class NamespaceContents:
    """KubernetesBackend's creation of what a project namespace holds besides pods."""

    config: KubernetesConfig
    networking: client.NetworkingV1Api
    rbac: client.RbacAuthorizationV1Api
    _call: Callable[..., Any]

    def _provision_namespace(self, name: str) -> None:
        """The namespace's NetworkPolicies (default deny, with what jobs need) and the web's
        log RoleBinding; each one that exists already is left as it is (an operator's edit
        stays; delete one to have it made again)."""
        for policy in render_network_policies(name, self.config):
            self._create_once(
                f"network policy {policy['metadata']['name']} in {name}",
                self.networking.create_namespaced_network_policy,
                name,
                policy,
            )
        self._create_once(
            f"log reader binding in {name}",
            self.rbac.create_namespaced_role_binding,
            name,
            render_log_reader_binding(name, self.config),
        )

    def _create_once(self, what: str, create: Callable[..., Any], *args: Any) -> None:
        try:
            self._call(what, create, *args)
        except ApiException as exc:
            if exc.status != CONFLICT:
                raise
