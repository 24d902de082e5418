"""PodRequest -> manifests: schema-valid, allow-listed, restricted-PSS compliant
(docs/faults.md 23)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import kubernetes_validate
import pytest

from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.kubernetes.render import (
    UnsafePodSpec,
    is_adoptable,
    label_value,
    render_pod,
    render_service,
)
from tests.k8s.builders import make_request
from tests.k8s.fake_apiserver import restricted_violations

CONFIG = KubernetesConfig()
VARIANTS = {
    "whole-gpus": make_request(gpu_milli=4000),
    "gpu-share": make_request(gpu_milli=250, gpu_memory_mib=10240, gpu_indices=(3,)),
    "mig-slice": make_request(gpu_milli=0, mig_profile="1g.10gb"),
    "cpu-only": make_request(gpu_milli=0, max_runtime_s=None),
    "distributed-rank-0": make_request(gpu_milli=8000, replicas=4, replica=0),
    "distributed-rank-3": make_request(gpu_milli=8000, replicas=4, replica=3),
}
# Every key a rendered pod may contain, by path. Anything else is a renderer bug
# (docs/faults.md 23).
ALLOWED_SPEC = {
    "schedulerName", "priorityClassName", "restartPolicy", "automountServiceAccountToken",
    "enableServiceLinks", "terminationGracePeriodSeconds", "securityContext", "containers",
    "tolerations", "activeDeadlineSeconds", "hostname", "subdomain",
}  # fmt: skip
ALLOWED_CONTAINER = {"name", "image", "command", "env", "resources", "securityContext", "ports"}


@pytest.mark.parametrize("request_", VARIANTS.values(), ids=VARIANTS.keys())
def test_rendered_pod_is_valid_for_kubernetes_1_30(request_: Any) -> None:
    assert kubernetes_validate.validate(render_pod(request_, CONFIG), "1.30", strict=True)


@pytest.mark.parametrize("request_", VARIANTS.values(), ids=VARIANTS.keys())
def test_rendered_pod_is_allow_listed_and_restricted(request_: Any) -> None:
    pod = render_pod(request_, CONFIG)
    spec = pod["spec"]
    assert set(spec) <= ALLOWED_SPEC
    (container,) = spec["containers"]
    assert set(container) <= ALLOWED_CONTAINER
    assert restricted_violations(pod) == []
    assert spec["schedulerName"] == "gantry"
    assert spec["automountServiceAccountToken"] is False
    assert "nodeName" not in spec and "serviceAccountName" not in spec
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert spec["securityContext"]["runAsUser"] != 0


def test_service_is_valid_and_headless() -> None:
    service = render_service(VARIANTS["distributed-rank-0"], CONFIG)
    assert kubernetes_validate.validate(service, "1.30", strict=True)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"gantry.io/job-id": "7", "gantry.io/attempt": "0"}


def _resources(request_: Any, device: str | None = None) -> dict[str, str]:
    container = render_pod(request_, CONFIG, device)["spec"]["containers"][0]
    assert container["resources"]["requests"] == container["resources"]["limits"]
    return dict(container["resources"]["limits"])


def test_whole_gpus_are_counted_devices() -> None:
    assert _resources(VARIANTS["whole-gpus"]) == {
        "cpu": "2000m",
        "memory": "8192Mi",
        "nvidia.com/gpu": "4",
    }


def test_gpu_share_uses_the_sharing_layer_resources() -> None:
    # 250 milli-GPU = 25 % of the cores, capped at 10 GiB of device memory (HAMi).
    limits = _resources(VARIANTS["gpu-share"])
    assert limits["nvidia.com/gpu"] == "1"
    assert limits["nvidia.com/gpucores"] == "25"
    assert limits["nvidia.com/gpumem"] == "10240"


def test_gpu_share_resource_names_are_configurable() -> None:
    config = replace(CONFIG, share_memory_resource="x/mem", share_cores_resource="x/cores")
    limits = render_pod(VARIANTS["gpu-share"], config)["spec"]["containers"][0]["resources"]
    assert {"x/mem", "x/cores"} <= set(limits["limits"])


def test_mig_slice_and_npu_devices() -> None:
    assert _resources(VARIANTS["mig-slice"])["nvidia.com/mig-1g.10gb"] == "1"
    npu = _resources(make_request(gpu_milli=2000), device="huawei.com/Ascend910")
    assert npu["huawei.com/Ascend910"] == "2" and "nvidia.com/gpu" not in npu


def test_cpu_only_pod_has_no_gpu_toleration_or_devices() -> None:
    pod = render_pod(VARIANTS["cpu-only"], CONFIG)
    assert "tolerations" not in pod["spec"] and "activeDeadlineSeconds" not in pod["spec"]
    assert set(_resources(VARIANTS["cpu-only"])) == {"cpu", "memory"}


def test_gpu_pod_scheduling_fields() -> None:
    pod = render_pod(VARIANTS["whole-gpus"], CONFIG)
    spec = pod["spec"]
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert spec["priorityClassName"] == "gantry-normal"
    assert spec["activeDeadlineSeconds"] == 3600
    assert spec["restartPolicy"] == "Never"
    assert pod["metadata"]["name"] == "gantry-7-a0-r0"
    assert pod["metadata"]["namespace"] == "team-a"
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "gantry",
        "gantry.io/job-id": "7",
        "gantry.io/attempt": "0",
        "gantry.io/replica": "0",
        "gantry.io/job-type": "training",
        "gantry.io/priority-class": "normal",
    }
    assert pod["metadata"]["annotations"] == {"gantry.io/gpu-indices": "0,1,2,3"}


def test_distributed_env_and_dns() -> None:
    pod = render_pod(VARIANTS["distributed-rank-3"], CONFIG)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env == {
        "LEARNING_RATE": "0.001",
        "WORLD_SIZE": "4",
        "RANK": "3",
        "MASTER_ADDR": "gantry-7-a0-r0.gantry-7-a0.team-a.svc",
        "MASTER_PORT": "29500",
    }
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("gantry-7-a0-r3", "gantry-7-a0")


def test_single_replica_has_no_distributed_env() -> None:
    env = render_pod(VARIANTS["whole-gpus"], CONFIG)["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["LEARNING_RATE"]


@pytest.mark.parametrize(
    "changes",
    [
        {"env": {"NVIDIA_VISIBLE_DEVICES": "all"}},
        {"env": {"CUDA_DEVICE_MEMORY_LIMIT_0": "80g"}},
        {"env": {"LD_PRELOAD": "/tmp/x.so"}},
        {"env": {"CUDA_DISABLE_CONTROL": "true"}},
        {"env": {"RANK": "0"}},
        {"env": {"BAD-NAME": "1"}},
        {"env": {"A": "nul\x00byte"}},
        {"image": "evil image"},
        {"image": ""},
        {"namespace": "Kube_System"},
        {"namespace": "kube-system"},
        {"namespace": "default"},
        {"namespace": "gantry-system"},
        {"name": "kube-proxy"},
        {"priority_class": "critical; rm -rf /"},
        {"mig_profile": "../../etc"},
        {"gpu_milli": 1500},
        {"command": ("sh", "-c", "x\x00")},
        {"replica": 2, "replicas": 2},
    ],
    ids=lambda c: ",".join(c),
)
def test_unsafe_requests_are_refused(changes: dict[str, Any]) -> None:
    if "name" not in changes and "replica" in changes:
        changes = changes | {"name": f"gantry-7-a0-r{changes['replica']}"}
    with pytest.raises(UnsafePodSpec):
        render_pod(make_request(**changes), CONFIG)


def test_shell_metacharacters_stay_arguments() -> None:
    request_ = make_request(command=("python", "-c", "print(1); rm -rf / && $(id)"))
    container = render_pod(request_, CONFIG)["spec"]["containers"][0]
    assert container["command"] == ["python", "-c", "print(1); rm -rf / && $(id)"]
    assert "args" not in container


@pytest.mark.parametrize(
    ("text", "value"),
    [("training", "training"), ("=cmd|' /C calc'!A0", "cmd----C-calc--A0"), ("x" * 80, "x" * 63)],
)
def test_label_values_are_label_safe(text: str, value: str) -> None:
    assert label_value(text) == value


def _as_apiserver_returns(pod: dict[str, Any]) -> dict[str, Any]:
    """What the apiserver adds: defaults, admission tolerations, status."""
    import copy

    out = copy.deepcopy(pod)
    out["metadata"] |= {"uid": "u1", "resourceVersion": "9"}
    out["spec"] |= {"dnsPolicy": "ClusterFirst", "serviceAccountName": "default"}
    out["spec"]["tolerations"] = [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        *out["spec"].get("tolerations", []),
    ]
    out["spec"]["containers"][0] |= {"imagePullPolicy": "IfNotPresent"}
    # quantities come back canonical: 2000m -> 2, 8192Mi -> 8Gi
    for section in out["spec"]["containers"][0]["resources"].values():
        section |= {"cpu": "2", "memory": "8Gi"}
    out["status"] = {"phase": "Pending"}
    return out


def test_our_pod_with_server_defaults_is_adoptable() -> None:
    pod = render_pod(VARIANTS["whole-gpus"], CONFIG)
    assert is_adoptable(_as_apiserver_returns(pod), pod)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda p: p["spec"].update(hostNetwork=True),
        lambda p: p["spec"].update(volumes=[{"name": "h", "hostPath": {"path": "/"}}]),
        lambda p: p["spec"].update(serviceAccountName="admin"),
        lambda p: p["spec"]["containers"][0].update(image="attacker/miner"),
        lambda p: p["spec"]["containers"][0]["securityContext"].update(privileged=True),
        lambda p: p["spec"]["containers"].append({"name": "side", "image": "x"}),
        lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": "8"}),
    ],
    ids=["hostNetwork", "hostPath", "serviceAccount", "image", "privileged", "sidecar", "gpus"],
)
def test_look_alike_pods_are_not_adoptable(tamper: Any) -> None:
    pod = render_pod(VARIANTS["whole-gpus"], CONFIG)
    existing = _as_apiserver_returns(pod)
    tamper(existing)
    assert not is_adoptable(existing, pod)
