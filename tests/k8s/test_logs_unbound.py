"""The log of a pod not bound to a node yet, on the fake and on the real API server (issue 22).

The real server has no kubelet to ask and answers 204 No Content at once, followed or not; the
fake answered 200 and, followed, held the stream open until the pod ended. The web app's
`gantry logs --follow` of a job still waiting for its bind therefore ends at once with no lines
on a real cluster; the fake now does the same.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from scheduler.backends.base import LogTarget
from tests.k8s.conftest import Cluster
from tests.k8s.real_plane import WAIT_S
from tests.k8s.test_contract import request_for


def _wait_for_the_default_account(cluster: Cluster) -> None:
    """A brand-new namespace refuses pods until the controller manager made its `default`
    ServiceAccount (the backend retries that a few times; a busy plane may take longer)."""
    core: Any = client.CoreV1Api(cluster.backend.api_client)
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            core.read_namespaced_service_account(
                "default", cluster.namespace, _preload_content=False
            ).release_conn()
            return
        except client.ApiException as error:
            if error.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def _unbound_pod(cluster: Cluster) -> LogTarget:
    if cluster.real:
        _wait_for_the_default_account(cluster)
    pod = request_for(cluster, 71)  # the contract's CPU-only pause pod
    cluster.backend.create_pod(pod)  # and never bound
    return LogTarget(
        namespace=pod.namespace,
        pod=pod.name,
        job_id=pod.job_id,
        attempt=0,
        replica=0,
        job_type="training",
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        ended_at=None,
    )


def _status(cluster: Cluster, target: LogTarget, **query: Any) -> int:
    core: Any = client.CoreV1Api(cluster.backend.api_client)
    response = core.read_namespaced_pod_log(
        target.pod, target.namespace, container="main", _preload_content=False, **query
    )
    try:
        return int(response.status)
    finally:
        response.close()  # a followed stream the fake would hold open is not read to its end
        response.release_conn()


def test_the_log_of_an_unbound_pod_is_no_content_followed_or_not(cluster: Cluster) -> None:
    target = _unbound_pod(cluster)
    try:
        assert _status(cluster, target, timestamps=True) == 204
        assert _status(cluster, target, timestamps=True, follow=True) == 204
        assert list(cluster.backend.follow_log(target)) == []  # ends at once, nothing to show
        assert cluster.backend.read_log(target, now=datetime.now(UTC)).lines == ()
    finally:
        cluster.backend.delete_pod(target.namespace, target.pod, grace_period_s=0)
