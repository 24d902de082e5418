"""Node objects (plain JSON dicts as the apiserver sends them) -> NodeInfo.

Pure functions over dicts, so that a list response and a watch event parse the same way and
tests need no client objects.

Counting rule: a node has `max(capacity, gpu.count label)` devices of which `allocatable` are
healthy. The device plugin drops a device from allocatable when it turns unhealthy (an XID, a
fallen-off-the-bus GPU); Kubernetes does not say which index, so the highest indices are marked
unhealthy. The node agent reports health per UUID where the exact device matters. Counts are
clamped at zero: a malformed or negative quantity never yields a negative inventory.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from scheduler.backends.base import GpuInfo, NodeInfo
from scheduler.backends.kubernetes.config import KubernetesConfig

PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per device
COUNT_LABEL = "nvidia.com/gpu.count"

_VENDOR_TOKENS = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO"}
_FORM_FACTOR = re.compile(r"^(SXM\d*|PCIE|HBM\d*E?|NVL|NVLINK|GDDR\d*X?)\Z", re.IGNORECASE)
_MEMORY_TOKEN = re.compile(r"^(\d+)GB\Z", re.IGNORECASE)


def flavor_from_product(product: str, overrides: Mapping[str, str] | None = None) -> str:
    """The flavor name for a GFD product label.

    Rule: an exact override wins; otherwise split on "-", stop at "MIG", drop vendor words
    (NVIDIA, Tesla, GeForce, Quadro) and form-factor words (SXM4, PCIe, HBM3, NVL), keep the
    rest. `NVIDIA-H100-80GB-HBM3` -> `H100-80GB`, `NVIDIA-A100-SXM4-40GB` -> `A100-40GB`,
    `Tesla-T4` -> `T4`.
    """
    if overrides and product in overrides:
        return overrides[product]
    kept: list[str] = []
    for token in product.split("-"):
        if token.upper() == "MIG":
            break
        if token and token.upper() not in _VENDOR_TOKENS and not _FORM_FACTOR.match(token):
            kept.append(token)
    return "-".join(kept) or product


def quantity(value: Any) -> Decimal:
    """A Kubernetes quantity ("8", "500m", "64Gi") as a Decimal; malformed or negative -> 0."""
    if value is None:
        return Decimal(0)
    if isinstance(value, str) and value.isdigit():  # the common case, cheaper than parsing
        return Decimal(int(value))
    try:
        parsed = parse_quantity(value)
    except (ValueError, InvalidOperation, TypeError):
        return Decimal(0)
    return max(parsed, Decimal(0))


def _count(resources: Mapping[str, Any], name: str) -> int:
    return int(quantity(resources.get(name)))


def _int_label(labels: Mapping[str, str], key: str) -> int:
    try:
        return max(int(labels.get(key, "0")), 0)
    except ValueError:
        return 0


@functools.lru_cache(maxsize=256)
def _devices(total: int, healthy: int, memory_mib: int) -> tuple[GpuInfo, ...]:
    # Shared between nodes (GpuInfo is frozen): thousands of identical nodes parse in a blink.
    return tuple(GpuInfo(index=i, memory_mib=memory_mib, healthy=i < healthy) for i in range(total))


def _accelerators(
    labels: Mapping[str, str],
    capacity: Mapping[str, Any],
    allocatable: Mapping[str, Any],
    config: KubernetesConfig,
) -> tuple[str, tuple[GpuInfo, ...], dict[str, int]]:
    """(flavor, devices, MIG resource -> count) of one node."""
    product = labels.get(PRODUCT_LABEL, "")
    mig = {
        name: _count(allocatable, name)
        for name in allocatable
        if name.startswith(config.mig_resource_prefix)
    }
    whole = _count(allocatable, config.gpu_resource)
    if "-MIG-" in product:
        # MIG "single" strategy: nvidia.com/gpu counts slices of one profile, not devices.
        profile = product.split("-MIG-", 1)[1]
        mig[config.mig_resource_prefix + profile] = whole
        return flavor_from_product(product, config.flavor_overrides), (), mig
    total = max(_count(capacity, config.gpu_resource), _int_label(labels, COUNT_LABEL), whole)
    if total or mig or product:
        memory = _int_label(labels, MEMORY_LABEL) or _memory_from_product(product)
        flavor = flavor_from_product(product, config.flavor_overrides) if product else ""
        return flavor, _devices(total, whole, memory), mig
    for resource, (flavor, memory_mib) in config.npu_resources.items():
        npus = max(_count(capacity, resource), _count(allocatable, resource))
        if npus:
            return flavor, _devices(npus, _count(allocatable, resource), memory_mib), {}
    return "", (), {}


def _memory_from_product(product: str) -> int:
    for token in product.split("-"):
        match = _MEMORY_TOKEN.match(token)
        if match:
            return int(match.group(1)) * 1024
    return 0


def _ready(status: Mapping[str, Any]) -> bool:
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def node_info(node: Mapping[str, Any], config: KubernetesConfig) -> NodeInfo:
    """Parse one Node object (JSON dict)."""
    metadata, spec, status = node.get("metadata", {}), node.get("spec", {}), node.get("status", {})
    labels = dict(metadata.get("labels") or {})
    capacity = status.get("capacity") or {}
    allocatable = status.get("allocatable") or capacity
    flavor, gpus, mig = _accelerators(labels, capacity, allocatable, config)
    rdma = sum(
        _count(allocatable, name)
        for name in allocatable
        if name.startswith(config.rdma_resource_prefixes)
    )
    taints = tuple(
        (t.get("key", ""), t.get("value") or "", t.get("effect", ""))
        for t in spec.get("taints") or ()
    )
    return NodeInfo(
        name=metadata["name"],
        flavor=flavor,
        gpus=gpus,
        cpu_milli=int(quantity(allocatable.get("cpu")) * 1000),
        memory_mib=int(quantity(allocatable.get("memory")) / (1024 * 1024)),
        rdma=rdma,
        ready=_ready(status),
        unschedulable=bool(spec.get("unschedulable", False)),
        labels=labels,
        taints=taints,
        mig=mig,
    )
