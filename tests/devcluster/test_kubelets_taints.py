"""devcluster.kubelets on a plane without the node lifecycle controller (as bench.k8s_peers
runs its scale runs): the nodes it registers are schedulable, by kube-scheduler and Gantry."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from devcluster.kubelets import Kubelets, NodeShape
from devcluster.plane import ControlPlane

pytestmark = pytest.mark.kubernetes

PLANE_DIR = Path("/tmp/h5-cp-kubelets")


@pytest.fixture(scope="module")
def api() -> Iterator[client.ApiClient]:
    plane = ControlPlane(PLANE_DIR)
    plane.stop()
    shutil.rmtree(PLANE_DIR / "etcd", ignore_errors=True)  # nodes of an earlier run
    plane.start(controller_manager=True, controllers="*,-nodelifecycle")
    api = config.new_client_from_config(str(plane.kubeconfig))
    yield api
    api.close()
    plane.stop()


def node_taints(api: client.ApiClient, name: str) -> list[dict[str, Any]]:
    core: Any = client.CoreV1Api(api)
    response = core.read_node(name, _preload_content=False)
    taints: list[dict[str, Any]] = json.loads(response.data)["spec"].get("taints") or []
    return taints


def test_added_nodes_lose_the_not_ready_taint_without_the_node_lifecycle_controller(
    api: client.ApiClient,
) -> None:
    # The API server's admission taints every new node not-ready; only the node lifecycle
    # controller lifted it, so on this plane kube-scheduler found no node at all.
    Kubelets(api).add_nodes(["plain-0"], NodeShape(gpus=8))
    assert node_taints(api, "plain-0") == []


def test_added_nodes_keep_the_taints_of_their_shape(api: client.ApiClient) -> None:
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    Kubelets(api).add_nodes(["tainted-0"], NodeShape(gpus=8, taints=[gpu_taint]))
    assert node_taints(api, "tainted-0") == [gpu_taint]
