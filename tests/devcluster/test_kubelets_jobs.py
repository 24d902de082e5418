"""Pods of batch/v1 Jobs on the simulated nodes move through their phases as on real nodes, so
the plane's Job controller (kube-controller-manager) finishes the Job: Complete when the
container exits 0, Failed once the back-off limit is spent, counting failed pods under
restartPolicy Never and container restarts under OnFailure (issue 37)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from devcluster.kubelets import EXIT_CODE, RUN_SECONDS
from tests.k8s.real_plane import RealPlane, drained, wait_for

pytestmark = pytest.mark.kubernetes
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def namespace(real_plane: RealPlane) -> Iterator[str]:
    if real_plane.kubelets is None:
        pytest.skip("KUBECONFIG's cluster: its nodes are not played by devcluster")
    core: Any = client.CoreV1Api(real_plane.api)
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    drained(core.create_namespace({"metadata": {"name": name}}, _preload_content=False))
    # Admission refuses pods until the controller manager made the namespace's account.
    wait_for(core.list_namespaced_service_account, name, "default", lambda sa: sa is not None)
    yield name
    drained(core.delete_namespace(name, _preload_content=False))


def job(name: str, node: str, *, policy: str, exit_code: int, backoff_limit: int = 0) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": {"annotations": {RUN_SECONDS: "0", EXIT_CODE: str(exit_code)}},
                "spec": {
                    "nodeName": node,  # bound at creation: no scheduler in this plane
                    "restartPolicy": policy,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    }


def finished(job: Obj | None) -> bool:
    conditions = ((job or {}).get("status") or {}).get("conditions") or ()
    return any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions)


def run(real_plane: RealPlane, namespace: str, body: Obj) -> tuple[Obj, list[Obj]]:
    """Create the Job, wait until its controller finished it: the Job and its pods."""
    batch: Any = client.BatchV1Api(real_plane.api)
    drained(batch.create_namespaced_job(namespace, body, _preload_content=False))
    name = body["metadata"]["name"]
    done = wait_for(batch.list_namespaced_job, namespace, name, finished)
    assert done is not None
    core: Any = client.CoreV1Api(real_plane.api)
    response = core.list_namespaced_pod(
        namespace, label_selector=f"job-name={name}", _preload_content=False
    )
    pods: list[Obj] = json.loads(response.data)["items"]
    response.release_conn()
    return done, pods


def condition(job: Obj) -> tuple[str, str]:
    (true,) = (c for c in job["status"]["conditions"] if c["type"] in ("Complete", "Failed"))
    return true["type"], true.get("reason", "")


def terminated(pod: Obj) -> Obj:
    (container,) = pod["status"]["containerStatuses"]
    state: Obj = container["state"]["terminated"]
    return state


def test_a_job_whose_pod_exits_0_completes(real_plane: RealPlane, namespace: str) -> None:
    node = real_plane.cpu_nodes[0]
    done, (pod,) = run(real_plane, namespace, job("ok", node, policy="Never", exit_code=0))
    assert condition(done)[0] == "Complete"
    assert done["status"]["succeeded"] == 1
    assert pod["status"]["phase"] == "Succeeded"
    assert terminated(pod)["exitCode"] == 0 and terminated(pod)["reason"] == "Completed"


def test_a_job_whose_pod_fails_under_never_fails_at_its_back_off_limit(
    real_plane: RealPlane, namespace: str
) -> None:
    node = real_plane.cpu_nodes[0]
    body = job("never", node, policy="Never", exit_code=3, backoff_limit=1)
    done, pods = run(real_plane, namespace, body)
    assert condition(done) == ("Failed", "BackoffLimitExceeded")
    # backoffLimit 1: the first failed pod is replaced, the second fails the Job.
    assert len(pods) == 2 and done["status"]["failed"] == 2
    for pod in pods:
        assert pod["status"]["phase"] == "Failed"
        assert terminated(pod)["exitCode"] == 3 and terminated(pod)["reason"] == "Error"


def test_a_job_whose_container_fails_under_on_failure_restarts_it_until_the_limit(
    real_plane: RealPlane, namespace: str
) -> None:
    node = real_plane.cpu_nodes[0]
    body = job("onfailure", node, policy="OnFailure", exit_code=2, backoff_limit=2)
    done, pods = run(real_plane, namespace, body)
    # The pod did not fail: its container restarted in it, the Job controller counted the
    # restarts against the limit and then stopped the one pod (under Never it would have made
    # a new pod per failure: 3).
    assert condition(done) == ("Failed", "BackoffLimitExceeded")
    assert done["status"].get("failed") == 1 and len(pods) <= 1
    for pod in pods:
        assert pod["status"]["phase"] != "Failed"
