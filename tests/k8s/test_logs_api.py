"""`/api/v1/jobs/{id}/logs/` on the Kubernetes backend, against the fake apiserver: the lines
a running pod wrote, and what a member is told about a pod that is gone or still creating."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from scheduler.backends.base import LogSource
from scheduler.backends.kubernetes.backend import KubernetesBackend
from scheduler.models import Allocation, JobState
from tests import factories as f
from tests.conftest import Org
from tests.k8s.builders import make_request
from tests.k8s.fake_apiserver import FakeApiServer


@pytest.fixture
def on_the_fake(backend: KubernetesBackend, monkeypatch: pytest.MonkeyPatch) -> KubernetesBackend:
    """The web process's log source is the backend over the fake apiserver."""
    monkeypatch.setattr("scheduler.api.pods.log_source", lambda: backend)
    return backend


def placed_job(org: Org) -> tuple[Any, Allocation]:
    job = f.JobFactory(
        project=org.proj_alpha, submitted_by=org.users["alice"], state=JobState.RUNNING
    )
    pod = make_request(job.pk)
    allocation = f.AllocationFactory(
        job=job, pod_name=pod.name, namespace=pod.namespace, bound_at=timezone.now()
    )
    return job, allocation


def test_the_kubernetes_backend_is_a_log_source(backend: KubernetesBackend) -> None:
    assert isinstance(backend, LogSource)


def test_a_running_pods_lines_then_only_new_ones(
    org: Org, client_for: Any, fake: FakeApiServer, on_the_fake: KubernetesBackend
) -> None:
    job, _ = placed_job(org)
    pod = make_request(job.pk)
    on_the_fake.create_pod(pod)
    on_the_fake.bind_pod(pod.namespace, pod.name, pod.node)
    fake.run_container(pod.namespace, pod.name)
    fake.write_log(pod.namespace, pod.name, "epoch 1", "epoch 2")
    client = client_for("alice")
    first = client.get(f"/api/v1/jobs/{job.pk}/logs/?tail=10").json()
    assert [line["text"] for line in first["lines"]] == ["epoch 1", "epoch 2"]
    fake.write_log(pod.namespace, pod.name, "epoch 3", at=timezone.now() + timedelta(seconds=1))
    again = client.get(f"/api/v1/jobs/{job.pk}/logs/", {"since": first["cursor"]}).json()
    assert [line["text"] for line in again["lines"]] == ["epoch 3"]


def test_a_pod_that_is_gone_answers_a_message(
    org: Org, client_for: Any, on_the_fake: KubernetesBackend
) -> None:
    job, _ = placed_job(org)  # the cluster has no such pod
    response = client_for("alice").get(f"/api/v1/jobs/{job.pk}/logs/")
    assert response.status_code == 200
    body = response.json()
    assert body["lines"] == [] and "is gone" in body["message"]


def test_a_pod_still_creating_answers_a_message(
    org: Org, client_for: Any, on_the_fake: KubernetesBackend
) -> None:
    job, _ = placed_job(org)
    pod = make_request(job.pk)
    on_the_fake.create_pod(pod)
    on_the_fake.bind_pod(pod.namespace, pod.name, pod.node)
    body = client_for("alice").get(f"/api/v1/jobs/{job.pk}/logs/").json()
    assert body["lines"] == [] and "has not started yet (ContainerCreating)" in body["message"]
    assert body["done"] is False


def test_an_apiserver_that_fails_is_a_503(
    org: Org, client_for: Any, fake: FakeApiServer, on_the_fake: KubernetesBackend
) -> None:
    job, _ = placed_job(org)
    fake.inject("503", "/log$", count=10)
    response = client_for("alice").get(f"/api/v1/jobs/{job.pk}/logs/")
    assert response.status_code == 503
    assert "could not be asked" in response.json()["detail"]
