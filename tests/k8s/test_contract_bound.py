"""Issue 37: pods created already on their node (`create_bound`, the default), against the
fake apiserver and the real one. One call per pod instead of a create and a bind; what a
retry, a crash between versions or a lost race leaves under our deterministic name is
adopted, bound, or refused as a conflict, as the two-call path does (test_contract.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from scheduler.backends.base import BindConflict, PodPhase
from scheduler.backends.kubernetes.backend import METADATA_ONLY, KubernetesBackend
from scheduler.backends.kubernetes.render import render_pod
from tests.k8s.conftest import Cluster
from tests.k8s.test_contract import ours, request_for


def bound_backend(cluster: Cluster) -> KubernetesBackend:
    config = replace(cluster.backend.config, create_bound=True)
    backend = KubernetesBackend(cluster.backend.api_client, config)
    backend.list_nodes()  # the device resource of each node, as the daemon's sync learns it
    return backend


def test_a_pod_created_bound_is_on_its_node_in_one_call(cluster: Cluster) -> None:
    backend = bound_backend(cluster)
    pod = request_for(cluster, 201)
    backend.create_pod(pod)
    backend.create_pod(pod)  # a retry adopts: no second pod, no error
    (status,) = ours(cluster, "gantry-201-a0-r0")
    assert status.node == cluster.nodes[0] and not status.deleting
    assert status.phase in (PodPhase.PENDING, PodPhase.RUNNING)


def test_our_unbound_pod_under_the_name_is_adopted_and_bound(cluster: Cluster) -> None:
    """Created unbound by a daemon of the other setting (or an older release) that then
    stopped: the bound path finds it, adopts it and binds it where it was placed."""
    pod = request_for(cluster, 202)
    cluster.backend.create_pod(pod)  # the fixture's backend: the two-call path
    assert ours(cluster, "gantry-202-a0-r0")[0].node is None
    bound_backend(cluster).create_pod(pod)
    (status,) = ours(cluster, "gantry-202-a0-r0")
    assert status.node == cluster.nodes[0]


def test_our_pod_on_another_node_is_a_conflict_naming_it(cluster: Cluster) -> None:
    if len(cluster.nodes) < 2:
        pytest.skip("needs two schedulable nodes")
    backend = bound_backend(cluster)
    backend.create_pod(request_for(cluster, 203, node=cluster.nodes[1]))
    with pytest.raises(BindConflict) as raised:
        backend.create_pod(request_for(cluster, 203))
    assert raised.value.bound_node == cluster.nodes[1] and not raised.value.deleting


def test_a_create_asked_for_its_metadata_alone_answers_nothing_else(cluster: Cluster) -> None:
    """What the create path relies on (the API server encodes, and the daemon parses, a tenth
    of the pod): asked so (`as=PartialObjectMetadata`), a create answers the object's
    metadata alone, with the version the informer waits for and the uid a Service's owner
    reference names."""
    manifest = render_pod(request_for(cluster, 204), cluster.backend.config, bound=True)
    response = cluster.backend.core.create_namespaced_pod(
        cluster.namespace, manifest, _headers={"Accept": METADATA_ONLY}, _preload_content=False
    )
    try:
        answer = json.loads(response.data)
    finally:
        response.release_conn()
    assert answer["kind"] == "PartialObjectMetadata" and set(answer) == {
        "kind",
        "apiVersion",
        "metadata",
    }
    meta = answer["metadata"]
    assert meta["name"] == "gantry-204-a0-r0" and meta["resourceVersion"] and meta["uid"]
    (status,) = ours(cluster, "gantry-204-a0-r0")
    assert status.node == cluster.nodes[0]  # created whole, on its node, whatever the answer
