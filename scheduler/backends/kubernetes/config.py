"""Settings of the Kubernetes backend: resource names, flavor naming, pod defaults.

Every knob has a default that fits a cluster running the NVIDIA GPU Operator (device plugin,
GPU Feature Discovery) and HAMi for GPU sharing. `KubernetesConfig.from_env()` reads the
`GANTRY_K8S_*` variables documented in docs/kubernetes.md; tests build the dataclass directly.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

# Resource name -> (flavor, memory per device in MiB). Huawei's device plugin advertises
# Ascend NPUs under these names; GFD labels do not exist for them.
DEFAULT_NPU_RESOURCES: Mapping[str, tuple[str, int]] = {
    "huawei.com/Ascend910": ("Ascend-910B", 65536),
    "huawei.com/Ascend310P": ("Ascend-310P", 24576),
}

# RFC 1918, shared address space (RFC 6598), link-local (the metadata address), IPv6 unique
# local and link-local: where pods, Services, nodes and cloud internals live.
PRIVATE_RANGES = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "fc00::/7",
    "fe80::/10",
)


@dataclass(frozen=True)
class KubernetesConfig:
    gpu_resource: str = "nvidia.com/gpu"
    # Prefix of MIG resources under the mixed strategy: nvidia.com/mig-1g.10gb.
    mig_resource_prefix: str = "nvidia.com/mig-"
    # GPU sharing layer (HAMi by default): a share is one `gpu_resource` plus these two.
    share_memory_resource: str = "nvidia.com/gpumem"  # MiB of device memory
    share_cores_resource: str = "nvidia.com/gpucores"  # percent of the device's SMs
    npu_resources: Mapping[str, tuple[str, int]] = field(
        default_factory=lambda: dict(DEFAULT_NPU_RESOURCES)
    )
    rdma_resource_prefixes: tuple[str, ...] = ("rdma/",)
    # Exact GFD product label -> flavor; wins over the naming rule (kubernetes_inventory).
    flavor_overrides: Mapping[str, str] = field(default_factory=dict)
    gpu_taint_key: str = "nvidia.com/gpu"
    scheduler_name: str = "gantry"
    priority_class_prefix: str = "gantry-"
    # Images often default to root; the restricted Pod Security Standard needs a non-root uid.
    run_as_user: int = 1000
    run_as_group: int = 1000
    master_port: int = 29500
    # Seconds for one API request (connect + read); a hung apiserver becomes a BackendError.
    request_timeout_s: float = 10.0
    page_size: int = 500
    # The client-side rate of API calls (every try of every request but the watches), as
    # kube-scheduler's --kube-api-qps and --kube-api-burst; qps 0 turns it off.
    api_qps: float = 200.0
    api_burst: int = 400
    # Creates and binds the daemon keeps in flight at once (a cycle's pods are sent
    # concurrently, each job as soon as it is claimed); 1 sends them in order.
    max_in_flight: int = 32
    # Pods are created already on the node Gantry chose (spec.nodeName: one call per pod)
    # instead of created unbound and then bound through pods/binding (two calls).
    create_bound: bool = True
    # While the daemon's watch runs, reconcile reads Gantry's pods from its cache once the
    # cache has seen the daemon's own writes; it waits this long for that, then lists.
    informer_wait_s: float = 2.0
    # The longest one node watch stream runs before the nodes are listed again; the inventory
    # sync reads the node watch's cache meanwhile (a hung stream breaks 30 s after this).
    node_watch_s: int = 60
    # A project namespace's NetworkPolicies (kubernetes_namespace): the cluster DNS its pods
    # may reach, and where else they may connect (the internet, less the private and
    # link-local ranges: other tenants, Gantry itself, the cloud metadata address).
    dns_namespace: str = "kube-system"
    dns_pod_labels: Mapping[str, str] = field(default_factory=lambda: {"k8s-app": "kube-dns"})
    egress_cidrs: tuple[str, ...] = ("0.0.0.0/0", "::/0")
    egress_except: tuple[str, ...] = PRIVATE_RANGES
    # The web's pods/log grant, bound in each project namespace (platform/k8s/02-rbac.yaml).
    platform_namespace: str = "gantry-system"
    log_reader_account: str = "gantry-app"
    log_reader_role: str = "gantry-app-reader"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KubernetesConfig:
        """Defaults, overridden by GANTRY_K8S_* variables (docs/kubernetes.md lists them)."""
        env = os.environ if environ is None else environ
        config = cls()
        strings = {
            "GANTRY_K8S_GPU_RESOURCE": "gpu_resource",
            "GANTRY_K8S_MIG_RESOURCE_PREFIX": "mig_resource_prefix",
            "GANTRY_K8S_SHARE_MEMORY_RESOURCE": "share_memory_resource",
            "GANTRY_K8S_SHARE_CORES_RESOURCE": "share_cores_resource",
            "GANTRY_K8S_GPU_TAINT_KEY": "gpu_taint_key",
            "GANTRY_K8S_DNS_NAMESPACE": "dns_namespace",
        }
        numbers = {
            "GANTRY_K8S_RUN_AS_USER": "run_as_user",
            "GANTRY_K8S_RUN_AS_GROUP": "run_as_group",
            "GANTRY_K8S_MASTER_PORT": "master_port",
        }
        changes: dict[str, object] = {
            attr: env[name] for name, attr in strings.items() if env.get(name)
        }
        changes |= {attr: int(env[name]) for name, attr in numbers.items() if env.get(name)}
        if env.get("GANTRY_K8S_REQUEST_TIMEOUT_S"):
            changes["request_timeout_s"] = float(env["GANTRY_K8S_REQUEST_TIMEOUT_S"])
        changes |= _calls(env)
        if env.get("GANTRY_K8S_FLAVOR_OVERRIDES"):
            changes["flavor_overrides"] = _str_map(env["GANTRY_K8S_FLAVOR_OVERRIDES"])
        if env.get("GANTRY_K8S_DNS_POD_LABELS"):
            changes["dns_pod_labels"] = _str_map(env["GANTRY_K8S_DNS_POD_LABELS"])
        # Set but empty: no egress beyond the namespace and DNS.
        for name, attr in (
            ("GANTRY_K8S_EGRESS_CIDRS", "egress_cidrs"),
            ("GANTRY_K8S_EGRESS_EXCEPT", "egress_except"),
        ):
            if name in env:
                changes[attr] = _cidrs(name, env[name])
        if env.get("GANTRY_K8S_NPU_RESOURCES"):
            raw = json.loads(env["GANTRY_K8S_NPU_RESOURCES"])
            changes["npu_resources"] = {k: (str(v[0]), int(v[1])) for k, v in raw.items()}
        return replace(config, **changes)  # type: ignore[arg-type]


def _calls(env: Mapping[str, str]) -> dict[str, object]:
    """The API call settings: the rate, the calls in flight, bound creation, the node watch's
    streams. ValueError naming
    the variable for a value out of range."""
    changes: dict[str, object] = {}
    if env.get("GANTRY_K8S_API_QPS"):
        changes["api_qps"] = _number("GANTRY_K8S_API_QPS", env, 0)
    if env.get("GANTRY_K8S_API_BURST"):
        changes["api_burst"] = int(_number("GANTRY_K8S_API_BURST", env, 1))
    if env.get("GANTRY_K8S_MAX_IN_FLIGHT"):
        changes["max_in_flight"] = int(_number("GANTRY_K8S_MAX_IN_FLIGHT", env, 1))
    if env.get("GANTRY_K8S_NODE_WATCH_S"):
        changes["node_watch_s"] = int(_number("GANTRY_K8S_NODE_WATCH_S", env, 1))
    if env.get("GANTRY_K8S_CREATE_BOUND"):
        value = env["GANTRY_K8S_CREATE_BOUND"].strip().lower()
        if value not in ("1", "0", "true", "false", "yes", "no"):
            raise ValueError(f"GANTRY_K8S_CREATE_BOUND: {value!r} is not true or false")
        changes["create_bound"] = value in ("1", "true", "yes")
    return changes


def _number(name: str, env: Mapping[str, str], least: float) -> float:
    try:
        value = float(env[name])
    except ValueError as exc:
        raise ValueError(f"{name}: {env[name]!r} is not a number") from exc
    if value < least:
        raise ValueError(f"{name}: {value:g} is below {least:g}")
    return value


def _str_map(text: str) -> dict[str, str]:
    """JSON object, or `product=flavor,product=flavor`."""
    if text.lstrip().startswith("{"):
        return {str(k): str(v) for k, v in json.loads(text).items()}
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {k.strip(): v.strip() for k, v in pairs}


def _cidrs(name: str, text: str) -> tuple[str, ...]:
    """Comma-separated networks; ValueError naming the variable for one that does not parse."""
    found = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            found.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError as exc:
            raise ValueError(f"{name}: {item!r} is not a network ({exc})") from exc
    return tuple(found)
