"""Node objects -> NodeInfo: flavors, GPUs, MIG, NPUs, conditions, taints, clamped counts."""

from __future__ import annotations

import pytest

from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.kubernetes.inventory import flavor_from_product, node_info
from tests.k8s.builders import node_dict

CONFIG = KubernetesConfig()
H100_LABELS = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.count": "8",
}


@pytest.mark.parametrize(
    ("product", "flavor"),
    [
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
        ("NVIDIA-A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA-A100-80GB-PCIe", "A100-80GB"),
        ("Tesla-T4", "T4"),
        ("Tesla-V100-SXM2-16GB", "V100-16GB"),
        ("NVIDIA-H100-NVL", "H100"),
        ("NVIDIA-L40S", "L40S"),
        ("NVIDIA-GeForce-RTX-4090", "RTX-4090"),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100-40GB"),
        ("NVIDIA", "NVIDIA"),  # nothing left after the rule: keep the label as it is
    ],
)
def test_flavor_naming_rule(product: str, flavor: str) -> None:
    assert flavor_from_product(product) == flavor


def test_flavor_override_wins() -> None:
    overrides = {"NVIDIA-H100-NVL": "H100-94GB"}
    assert flavor_from_product("NVIDIA-H100-NVL", overrides) == "H100-94GB"
    assert flavor_from_product("NVIDIA-H100-80GB-HBM3", overrides) == "H100-80GB"


def test_gpu_node() -> None:
    raw = node_dict(
        capacity={"nvidia.com/gpu": "8", "rdma/ib": "4"},
        labels=H100_LABELS,
        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    )
    raw["status"]["allocatable"] |= {"cpu": "63500m", "memory": "500Gi"}
    node = node_info(raw, CONFIG)
    assert node.flavor == "H100-80GB"
    assert [g.index for g in node.gpus] == list(range(8))
    assert all(g.healthy and g.memory_mib == 81559 for g in node.gpus)
    # allocatable, not capacity: 63.5 cores, 500 GiB
    assert (node.cpu_milli, node.memory_mib, node.rdma) == (63500, 512000, 4)
    assert node.ready and not node.unschedulable
    assert node.taints == (("nvidia.com/gpu", "present", "NoSchedule"),)
    assert node.labels["nvidia.com/gpu.count"] == "8"


def test_lost_gpu_shrinks_allocatable_and_marks_devices_unhealthy() -> None:
    # An XID took two devices out: capacity 8, allocatable 6 -> 8 devices, 6 healthy.
    raw = node_dict(
        capacity={"nvidia.com/gpu": "8"}, allocatable={"nvidia.com/gpu": "6"}, labels=H100_LABELS
    )
    node = node_info(raw, CONFIG)
    assert len(node.gpus) == 8
    assert [g.healthy for g in node.gpus] == [True] * 6 + [False] * 2


@pytest.mark.parametrize("allocatable", ["-2", "garbage", "0"])
def test_counts_never_go_negative(allocatable: str) -> None:
    raw = node_dict(
        capacity={"nvidia.com/gpu": "4", "cpu": "-1"},
        allocatable={"nvidia.com/gpu": allocatable},
        labels=H100_LABELS | {"nvidia.com/gpu.count": "-3"},
    )
    node = node_info(raw, CONFIG)
    assert len(node.gpus) == 4
    assert not any(g.healthy for g in node.gpus)
    assert node.cpu_milli == 0


def test_device_plugin_down_keeps_devices_from_gfd_count_but_none_healthy() -> None:
    node = node_info(node_dict(labels=H100_LABELS), CONFIG)
    assert len(node.gpus) == 8 and not any(g.healthy for g in node.gpus)


def test_mig_mixed_strategy() -> None:
    raw = node_dict(
        capacity={"nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-3g.40gb": "2"},
        labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "4"},
    )
    node = node_info(raw, CONFIG)
    assert node.mig == {"nvidia.com/mig-1g.10gb": 14, "nvidia.com/mig-3g.40gb": 2}
    assert node.flavor == "H100-80GB"
    assert node.gpus[0].memory_mib == 80 * 1024  # from the product name, no memory label


def test_mig_single_strategy_counts_slices_not_devices() -> None:
    raw = node_dict(
        capacity={"nvidia.com/gpu": "56"},
        labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"},
    )
    node = node_info(raw, CONFIG)
    assert node.gpus == ()
    assert node.mig == {"nvidia.com/mig-1g.5gb": 56}
    assert node.flavor == "A100-40GB"


def test_npu_node_by_resource_name() -> None:
    raw = node_dict(
        capacity={"huawei.com/Ascend910": "8"}, allocatable={"huawei.com/Ascend910": "7"}
    )
    node = node_info(raw, CONFIG)
    assert node.flavor == "Ascend-910B"
    assert len(node.gpus) == 8 and sum(g.healthy for g in node.gpus) == 7
    assert node.gpus[0].memory_mib == 65536


def test_cpu_only_node() -> None:
    node = node_info(node_dict("cpu-1"), CONFIG)
    assert (node.flavor, node.gpus, node.mig) == ("", (), {})


@pytest.mark.parametrize(
    ("ready", "expected"), [("True", True), ("False", False), ("Unknown", False)]
)
def test_ready_condition(ready: str, expected: bool) -> None:
    assert node_info(node_dict(ready=ready), CONFIG).ready is expected


def test_missing_conditions_mean_not_ready_and_cordon_is_read() -> None:
    raw = node_dict(unschedulable=True)
    raw["status"]["conditions"] = []
    node = node_info(raw, CONFIG)
    assert not node.ready and node.unschedulable


def test_config_from_env() -> None:
    config = KubernetesConfig.from_env(
        {
            "GANTRY_K8S_SHARE_MEMORY_RESOURCE": "volcano.sh/vgpu-memory",
            "GANTRY_K8S_SHARE_CORES_RESOURCE": "volcano.sh/vgpu-cores",
            "GANTRY_K8S_FLAVOR_OVERRIDES": "NVIDIA-H100-NVL=H100-94GB, Tesla-T4=T4-16GB",
            "GANTRY_K8S_NPU_RESOURCES": '{"huawei.com/Ascend910": ["Ascend-910", 32768]}',
            "GANTRY_K8S_RUN_AS_USER": "2000",
            "GANTRY_K8S_REQUEST_TIMEOUT_S": "2.5",
        }
    )
    assert config.share_memory_resource == "volcano.sh/vgpu-memory"
    assert config.share_cores_resource == "volcano.sh/vgpu-cores"
    assert config.flavor_overrides == {"NVIDIA-H100-NVL": "H100-94GB", "Tesla-T4": "T4-16GB"}
    assert config.npu_resources == {"huawei.com/Ascend910": ("Ascend-910", 32768)}
    assert (config.run_as_user, config.request_timeout_s) == (2000, 2.5)
    assert KubernetesConfig.from_env({}) == KubernetesConfig()
