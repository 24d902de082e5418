"""JobSet's controller manager beside the real plane (devcluster/controllers.py, a peer built with
`python -m devcluster build --peers`): a JobSet created in the plane is defaulted by its
release's webhook and makes one Job per replica, owned by the JobSet (issue 37)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from kubernetes import client

from devcluster import controllers
from devcluster.versions import binary
from tests.k8s.real_plane import RealPlane, drained, wait_for

pytestmark = pytest.mark.kubernetes


def test_a_jobset_makes_its_jobs(real_plane: RealPlane) -> None:
    if real_plane.plane is None:
        pytest.skip("KUBECONFIG's cluster: JobSet's manager runs beside devcluster's plane")
    if not binary("jobset").is_file():
        pytest.skip("JobSet's manager is not built (python -m devcluster build --peers)")
    api = real_plane.api
    core: Any = client.CoreV1Api(api)
    namespace = f"jobset-{uuid.uuid4().hex[:8]}"
    drained(core.create_namespace({"metadata": {"name": namespace}}, _preload_content=False))
    pod = {"spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}
    body = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "train"},
        "spec": {
            "replicatedJobs": [
                {"name": "w", "replicas": 2, "template": {"spec": {"template": pod}}}
            ]
        },
    }
    objects: Any = client.CustomObjectsApi(api)
    batch: Any = client.BatchV1Api(api)
    try:
        with controllers.running(real_plane.plane, api, "JobSet"):
            response = objects.create_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", body, _preload_content=False
            )
            created = json.loads(response.data)
            response.release_conn()
            # The release's defaulting webhook ran (without it the controller panics).
            assert created["spec"]["successPolicy"]["operator"] == "All"
            for index in (0, 1):
                job = wait_for(
                    batch.list_namespaced_job,
                    namespace,
                    f"train-w-{index}",
                    lambda j: j is not None,
                )
                assert job is not None
                (owner,) = job["metadata"]["ownerReferences"]
                assert (owner["kind"], owner["name"]) == ("JobSet", "train")
                # Defaulted by the webhook too: the Jobs are Indexed.
                assert job["spec"]["completionMode"] == "Indexed"
    finally:
        drained(core.delete_namespace(namespace, _preload_content=False))
