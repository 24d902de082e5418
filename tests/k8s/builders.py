"""Small builders for the Kubernetes backend tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from scheduler.backends.base import PodRequest, pod_name


def make_request(
    job_id: int = 7,
    *,
    attempt: int = 0,
    replica: int = 0,
    replicas: int = 1,
    namespace: str = "team-a",
    node: str = "gpu-1",
    gpu_milli: int = 1000,
    **changes: Any,
) -> PodRequest:
    request = PodRequest(
        name=pod_name(job_id, attempt, replica),
        namespace=namespace,
        job_id=job_id,
        attempt=attempt,
        replica=replica,
        replicas=replicas,
        node=node,
        gpu_indices=tuple(range(max(gpu_milli // 1000, 1))) if gpu_milli else (),
        gpu_milli=gpu_milli,
        gpu_memory_mib=None,
        cpu_milli=2000,
        memory_mib=8192,
        image="registry.example.com/team-a/train:1.0",
        command=("python", "train.py", "--epochs", "3"),
        env={"LEARNING_RATE": "0.001"},
        priority_class="normal",
        job_type="training",
        max_runtime_s=3600,
    )
    return replace(request, **changes)


def node_dict(
    name: str = "gpu-1",
    *,
    capacity: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    ready: str = "True",
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    capacity = {"cpu": "64", "memory": "512Gi", **(capacity or {})}
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "capacity": capacity,
            "allocatable": {**capacity, **(allocatable or {})},
            "conditions": [{"type": "Ready", "status": ready}],
        },
    }
