"""Issue 22, found on the real API server: a refused request said only "apiserver 403:
Forbidden", so a job's reason hid why (a namespace's ResourceQuota, Pod Security, a missing
PriorityClass or service account: the Status message says which). The backend's errors carry
the server's message; tests/daemon/test_kubernetes_real.py shows it in a job's reason."""

from __future__ import annotations

import pytest

from scheduler.backends.base import BackendError
from scheduler.backends.kubernetes.backend import ApiRejected, KubernetesBackend
from tests.k8s.builders import make_request
from tests.k8s.fake_apiserver import FakeApiServer

PODS = r"/api/v1/namespaces/[^/]+/pods\Z"


def test_a_refusal_carries_the_servers_message(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    fake.inject("403", PODS, method="POST")
    with pytest.raises(ApiRejected) as raised:
        backend.create_pod(make_request())
    assert str(raised.value) == "apiserver 403: Forbidden: injected"


def test_a_transient_failure_carries_the_servers_message(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    fake.inject("503", PODS, method="POST", count=3)
    with pytest.raises(BackendError) as raised:
        backend.create_pod(make_request())
    assert str(raised.value) == "apiserver 503: Service Unavailable: injected"


def test_a_pod_in_a_namespace_without_its_service_account_yet_is_retried(
    fake: FakeApiServer, backend: KubernetesBackend
) -> None:
    """Found on the real server: the backend creates a project's namespace right before its
    first pod, and admission refuses the pod (403) until the controller manager has made the
    namespace's `default` ServiceAccount. That 403 is transient: retried, not a refusal."""
    fake.account_lag = True
    backend.create_pod(make_request(namespace="team-new"))
    assert [p.name for p in backend.list_pods() if p.namespace == "team-new"] == ["gantry-7-a0-r0"]
