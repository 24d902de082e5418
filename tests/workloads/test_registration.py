"""The shipped MutatingWebhookConfiguration is the one registration.py renders, and names
every kind the webhook holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from scheduler.management.commands.run_webhook import DAEMON_ACCOUNT
from scheduler.workloads import kinds, registration

MANIFEST = Path(__file__).resolve().parents[2] / "platform" / "k8s" / "24-webhook.yaml"


def _shipped(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] == kind]
    return dict(doc)


def test_the_manifest_is_what_registration_renders() -> None:
    shipped = _shipped("MutatingWebhookConfiguration")
    rendered = registration.configuration(registration.service_client())
    # cert-manager fills the caBundle in the cluster; the rest is the rendering, field by field.
    assert shipped["metadata"].pop("annotations") == {
        "cert-manager.io/inject-ca-from": "gantry-system/gantry-webhook"
    }
    assert shipped == rendered


def test_every_kind_held_is_sent_on_create_only() -> None:
    sent = {
        (group, version, resource)
        for rule in registration.rules()
        for group in rule["apiGroups"]
        for version in rule["apiVersions"]
        for resource in rule["resources"]
    }
    assert sent == {(k.group, k.version, k.plural) for k in kinds.KINDS.values()}
    assert {op for rule in registration.rules() for op in rule["operations"]} == {"CREATE"}


def test_the_service_and_the_deployment_meet() -> None:
    service = _shipped("Service")
    deployment = _shipped("Deployment")
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    client = registration.service_client()["service"]
    assert (client["namespace"], client["name"]) == (
        service["metadata"]["namespace"],
        service["metadata"]["name"],
    )
    assert client["port"] == service["spec"]["ports"][0]["port"]
    (container,) = pod["spec"]["containers"]
    command = container["command"]
    assert command[command.index("--port") + 1] == str(container["ports"][0]["containerPort"])
    # Gantry's daemon creates its pods already placed: a gate would have them refused.
    assert command[command.index("--exempt-user") + 1] == DAEMON_ACCOUNT


def test_the_policy_guards_every_kind_held_and_lets_the_daemon_through() -> None:
    policy = _shipped("ValidatingAdmissionPolicy")["spec"]
    guarded = {
        (group, resource)
        for rule in policy["matchConstraints"]["resourceRules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert guarded == {(k.group, k.plural) for k in kinds.KINDS.values()}
    (not_daemon,) = [
        c for c in policy["matchConditions"] if c["name"] == "not-the-scheduler-daemon"
    ]
    assert f"'{DAEMON_ACCOUNT}'" in not_daemon["expression"]
    binding = _shipped("ValidatingAdmissionPolicyBinding")["spec"]
    assert binding["matchResources"]["namespaceSelector"]["matchLabels"] == (
        registration.MANAGED_NAMESPACES
    )
