"""Issue 22, found by the daemon's tests on the real API server: a graceful delete of a pod
that has finished removes it at once, as one that was never bound is removed: no kubelet has
anything left to stop. The fake kept it Terminating until its kubelet confirmed; mended."""

from __future__ import annotations

from tests.k8s.conftest import Cluster
from tests.k8s.test_contract import ours, request_for


def test_a_graceful_delete_of_a_finished_pod_removes_it_at_once(cluster: Cluster) -> None:
    name = "gantry-190-a0-r0"
    cluster.backend.create_pod(request_for(cluster, 190))
    cluster.backend.bind_pod(cluster.namespace, name, cluster.nodes[0])
    cluster.kubelet.start(cluster.namespace, name)
    cluster.kubelet.keep_terminating(cluster.namespace, name)  # no kubelet would confirm
    cluster.kubelet.succeed(cluster.namespace, name)
    cluster.backend.delete_pod(cluster.namespace, name, grace_period_s=30)
    assert ours(cluster, name) == []
