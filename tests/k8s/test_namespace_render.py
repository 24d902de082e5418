"""A project namespace's NetworkPolicies as configured
(scheduler/backends/kubernetes/namespaces.py).

What the shipped defaults select is judged on the real API server
(tests/k8s/test_network_policies_real.py); here, the GANTRY_K8S_* settings that change them.
"""

from __future__ import annotations

import re

import pytest

from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.kubernetes.namespaces import egress_blocks, render_network_policies


def _egress(config: KubernetesConfig) -> list[dict[str, object]] | None:
    policies = {p["metadata"]["name"]: p for p in render_network_policies("team-a", config)}
    egress = policies.get("gantry-egress")
    return None if egress is None else egress["spec"]["egress"][0]["to"]


def test_the_metadata_address_is_excepted_whatever_is_configured() -> None:
    """An operator who opens the private ranges (GANTRY_K8S_EGRESS_EXCEPT empty) still keeps
    job pods off the cloud's metadata service."""
    config = KubernetesConfig.from_env({"GANTRY_K8S_EGRESS_EXCEPT": ""})
    assert _egress(config) == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}},
        {"ipBlock": {"cidr": "::/0", "except": ["fd00:ec2::254/128"]}},
    ]


def test_egress_to_chosen_networks_only() -> None:
    config = KubernetesConfig.from_env({"GANTRY_K8S_EGRESS_CIDRS": "203.0.113.0/24, 10.20.0.0/16"})
    # Only the excepted ranges inside each allowed one (the API refuses any other).
    assert _egress(config) == [
        {"ipBlock": {"cidr": "203.0.113.0/24"}},
        {"ipBlock": {"cidr": "10.20.0.0/16"}},
    ]
    # 10.20.0.0/16 lies inside the excepted 10.0.0.0/8: named on purpose, it is allowed whole.


def test_no_egress_beyond_the_namespace_and_dns() -> None:
    config = KubernetesConfig.from_env({"GANTRY_K8S_EGRESS_CIDRS": ""})
    names = {p["metadata"]["name"] for p in render_network_policies("team-a", config)}
    assert names == {"gantry-default-deny", "gantry-same-namespace", "gantry-dns"}


def test_dns_selectors_are_configurable() -> None:
    config = KubernetesConfig.from_env(
        {"GANTRY_K8S_DNS_NAMESPACE": "dns", "GANTRY_K8S_DNS_POD_LABELS": "app=coredns"}
    )
    (dns,) = [
        p for p in render_network_policies("t", config) if p["metadata"]["name"] == "gantry-dns"
    ]
    (peer,) = dns["spec"]["egress"][0]["to"]
    assert peer == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "dns"}},
        "podSelector": {"matchLabels": {"app": "coredns"}},
    }


def test_a_bad_network_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=re.escape("GANTRY_K8S_EGRESS_EXCEPT: '10.0.0.0/33'")):
        KubernetesConfig.from_env({"GANTRY_K8S_EGRESS_EXCEPT": "10.0.0.0/33"})


def test_nested_excepts_are_named_once() -> None:
    blocks = egress_blocks(("0.0.0.0/0",), ("169.254.0.0/16", "10.0.0.0/8", "10.1.0.0/16"))
    assert blocks == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16", "10.0.0.0/8"]}}
    ]
