"""What a set of NetworkPolicies allows, by the rules of networking.k8s.io/v1 (for the tests of
the policies as the API server stores them; no CNI runs in the test cluster to enforce them).

The rules, from the API reference: a pod is isolated for ingress (egress) once any policy of its
namespace selects it and names Ingress (Egress) in its policyTypes; an isolated pod takes
(sends) only what some such policy's rules allow, the union of them all. A rule allows a peer
when one of its `from`/`to` entries matches (none: every peer) and one of its ports does (none:
every port). An entry with a podSelector only means pods of the policy's own namespace; with a
namespaceSelector, pods of the namespaces it selects (and its podSelector, if any); an ipBlock,
addresses in its cidr and in none of its excepts. A connection needs both ends: the sender's
egress and the receiver's ingress.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str]
    ip: str
    ports: Mapping[str, int] = field(default_factory=dict)  # the containers' named ports
    namespace_labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def all_namespace_labels(self) -> dict[str, str]:
        # The API server labels every namespace with its name.
        return {**self.namespace_labels, "kubernetes.io/metadata.name": self.namespace}


Peer = Pod | str  # a pod, or an address outside the cluster


def selects(selector: Obj | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector: matchLabels and matchExpressions all hold ({} selects everything)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        held = labels.get(key)
        ok = {
            "In": held is not None and held in (values or ()),
            "NotIn": held is None or held not in (values or ()),
            "Exists": held is not None,
            "DoesNotExist": held is None,
        }[operator]
        if not ok:
            return False
    return True


def _address(peer: Peer) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(peer.ip if isinstance(peer, Pod) else peer)


def _in_block(block: Obj, peer: Peer) -> bool:
    address = _address(peer)
    if address not in ipaddress.ip_network(block["cidr"]):
        return False
    return not any(address in ipaddress.ip_network(hole) for hole in block.get("except") or ())


def _peer_matches(entry: Obj, peer: Peer, policy_namespace: str) -> bool:
    if "ipBlock" in entry:
        return _in_block(entry["ipBlock"], peer)
    if not isinstance(peer, Pod):
        return False
    if "namespaceSelector" in entry:
        if not selects(entry["namespaceSelector"], peer.all_namespace_labels):
            return False
    elif peer.namespace != policy_namespace:
        return False
    return "podSelector" not in entry or selects(entry["podSelector"], peer.labels)


def _port_matches(ports: list[Obj] | None, target: Peer, port: int, protocol: str) -> bool:
    if not ports:
        return True
    for allowed in ports:
        if allowed.get("protocol", "TCP") != protocol:
            continue
        number = allowed.get("port")
        if number is None:
            return True
        if isinstance(number, str):
            number = target.ports.get(number) if isinstance(target, Pod) else None
        end = allowed.get("endPort", number)
        if number is not None and number <= port <= end:
            return True
    return False


def _allowed(
    policies: Iterable[Obj], pod: Pod, direction: str, peer: Peer, port: int, protocol: str
) -> bool:
    """Whether `pod` sends to (Egress) or takes from (Ingress) `peer` on `port`."""
    key, peers_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    mine = [
        p
        for p in policies
        if p["metadata"]["namespace"] == pod.namespace
        and direction in p["spec"].get("policyTypes", ["Ingress"])
        and selects(p["spec"].get("podSelector"), pod.labels)
    ]
    if not mine:
        return True  # not isolated
    target = peer if direction == "Egress" else pod  # whose named ports the rule names
    for policy in mine:
        for rule in policy["spec"].get(key) or ():
            entries = rule.get(peers_key)
            namespace = policy["metadata"]["namespace"]
            if entries and not any(_peer_matches(e, peer, namespace) for e in entries):
                continue
            if _port_matches(rule.get("ports"), target, port, protocol):
                return True
    return False


def connects(
    policies: Iterable[Obj], source: Pod, target: Peer, port: int, protocol: str = "TCP"
) -> bool:
    """Both ends allow it: the source's egress, and the target's ingress when it is a pod."""
    policies = list(policies)
    if not _allowed(policies, source, "Egress", target, port, protocol):
        return False
    return not isinstance(target, Pod) or ingress_allows(policies, target, source, port, protocol)


def ingress_allows(
    policies: Iterable[Obj], target: Pod, source: Pod, port: int, protocol: str = "TCP"
) -> bool:
    """The target's side alone: its namespace's policies let `source` in."""
    return _allowed(policies, target, "Ingress", source, port, protocol)
