"""Issue 22, found on the real API server: a refused request said only "apiserver 403:
Forbidden", so a job's reason hid why (a namespace's ResourceQuota, Pod Security, a missing
PriorityClass or service account: the Status message says which). The backend's errors carry
the server's message; tests/daemon/test_kubernetes_real.py shows it in a job's reason."""

from __future__ import annotations

import pytest

from scheduler.backends.base import BackendError
from scheduler.backends.kubernetes import ApiRejected, KubernetesBackend
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
