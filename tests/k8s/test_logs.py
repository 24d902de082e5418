"""Pod logs through the Kubernetes backend, against the fake apiserver: tails, cursors,
following, and the answers of a cluster with no log to give (gone, not started)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from scheduler.backends.base import BackendError, LogTarget, LogUnavailable, PodRequest
from scheduler.backends.kubernetes.backend import KubernetesBackend
from tests.k8s.builders import make_request
from tests.k8s.fake_apiserver import FakeApiServer

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def target_of(pod: PodRequest) -> LogTarget:
    return LogTarget(
        namespace=pod.namespace,
        pod=pod.name,
        job_id=pod.job_id,
        attempt=pod.attempt,
        replica=pod.replica,
        job_type=pod.job_type,
        started_at=T0,
        ended_at=None,
    )


def running_pod(backend: KubernetesBackend, fake: FakeApiServer, **changes: object) -> PodRequest:
    pod = make_request(**changes)  # type: ignore[arg-type]
    backend.create_pod(pod)
    backend.bind_pod(pod.namespace, pod.name, pod.node)
    fake.run_container(pod.namespace, pod.name)
    return pod


def texts(page_lines: tuple[object, ...]) -> list[str]:
    return [line.text for line in page_lines]  # type: ignore[attr-defined]


def test_tail_returns_the_last_lines_with_their_times(
    backend: KubernetesBackend, fake: FakeApiServer
) -> None:
    pod = running_pod(backend, fake)
    now = datetime.now(UTC)
    for i in range(5):
        fake.write_log(pod.namespace, pod.name, f"step {i}", at=now + timedelta(microseconds=i))
    page = backend.read_log(target_of(pod), now=now, tail=2)
    assert texts(page.lines) == ["step 3", "step 4"]
    assert page.lines[-1].at == now + timedelta(microseconds=4)
    assert page.cursor


def test_cursor_returns_only_lines_written_after_it(
    backend: KubernetesBackend, fake: FakeApiServer
) -> None:
    pod = running_pod(backend, fake)
    now = datetime.now(UTC)
    fake.write_log(pod.namespace, pod.name, "one", "two", at=now)  # the same nanosecond
    first = backend.read_log(target_of(pod), now=now, tail=10)
    fake.write_log(pod.namespace, pod.name, "three", at=now)  # still the same nanosecond
    second = backend.read_log(target_of(pod), now=now, cursor=first.cursor)
    fake.write_log(pod.namespace, pod.name, "four", at=now + timedelta(milliseconds=5))
    third = backend.read_log(target_of(pod), now=now, cursor=second.cursor)
    assert texts(first.lines) == ["one", "two"]
    assert texts(second.lines) == ["three"]  # the cursor counts the lines at its time
    assert texts(third.lines) == ["four"]
    fourth = backend.read_log(target_of(pod), now=now, cursor=third.cursor)
    assert texts(fourth.lines) == []
    assert fourth.cursor == third.cursor


def test_a_pod_that_is_gone_is_a_clear_message_not_an_error(
    backend: KubernetesBackend, fake: FakeApiServer
) -> None:
    pod = running_pod(backend, fake)
    backend.delete_pod(pod.namespace, pod.name)
    fake.finalize_pod(pod.namespace, pod.name)
    with pytest.raises(LogUnavailable, match="is gone"):
        backend.read_log(target_of(pod), now=datetime.now(UTC), tail=10)


def test_a_pod_still_creating_its_container_says_so(
    backend: KubernetesBackend, fake: FakeApiServer
) -> None:
    pod = make_request()
    backend.create_pod(pod)
    backend.bind_pod(pod.namespace, pod.name, pod.node)  # bound; the kubelet has not started it
    with pytest.raises(LogUnavailable, match=r"has not started yet \(ContainerCreating\)"):
        backend.read_log(target_of(pod), now=datetime.now(UTC), tail=10)


def test_a_pod_that_cannot_pull_its_image_says_so(
    backend: KubernetesBackend, fake: FakeApiServer
) -> None:
    pod = make_request()
    backend.create_pod(pod)
    backend.bind_pod(pod.namespace, pod.name, pod.node)
    fake.stay_pending(pod.namespace, pod.name, "ImagePullBackOff", "Back-off pulling image")
    with pytest.raises(LogUnavailable, match="failing to pull image"):
        backend.read_log(target_of(pod), now=datetime.now(UTC), tail=10)


def test_an_unbound_pod_answers_an_empty_log(
    backend: KubernetesBackend, fake: FakeApiServer
) -> None:
    """The apiserver has no kubelet to ask: an empty 200, as the real one answers."""
    pod = make_request()
    backend.create_pod(pod)
    page = backend.read_log(target_of(pod), now=datetime.now(UTC), tail=10)
    assert page.lines == ()


def test_an_apiserver_that_fails_is_a_backend_error_not_a_missing_log(
    backend: KubernetesBackend, fake: FakeApiServer
) -> None:
    pod = running_pod(backend, fake)
    fake.inject("500", f"/pods/{pod.name}/log", count=10)
    with pytest.raises(BackendError):  # transient: the API answers 503, the client retries
        backend.read_log(target_of(pod), now=datetime.now(UTC), tail=10)


def test_a_foreign_cursor_is_refused() -> None:
    from scheduler.backends.kubernetes.logs import after

    with pytest.raises(ValueError, match="not a log cursor"):
        after([], "42")


def test_follow_streams_new_lines_until_the_pod_ends(
    backend: KubernetesBackend, fake: FakeApiServer
) -> None:
    pod = running_pod(backend, fake)
    fake.write_log(pod.namespace, pod.name, "old 1", "old 2", "old 3")
    seen: list[str] = []
    first_two = threading.Event()

    def reader() -> None:
        for line in backend.follow_log(target_of(pod), tail=2):
            seen.append(line.text)
            if len(seen) == 2:
                first_two.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    assert first_two.wait(10)
    fake.write_log(pod.namespace, pod.name, "new 1")
    fake.set_pod_status(pod.namespace, pod.name, {"phase": "Succeeded"})
    thread.join(10)
    assert not thread.is_alive(), "follow did not end with the pod"
    assert seen == ["old 2", "old 3", "new 1"]


def test_follow_cut_mid_stream_ends_with_a_backend_error_saying_so(
    backend: KubernetesBackend, fake: FakeApiServer
) -> None:
    """The apiserver (or a proxy) drops the followed stream after the first lines: the lines
    so far arrive, then a BackendError that says what happened, not urllib3's ProtocolError."""
    pod = running_pod(backend, fake)
    fake.write_log(pod.namespace, pod.name, "step 1", "step 2")
    fake.inject("reset", f"/pods/{pod.name}/log")
    seen: list[str] = []
    with pytest.raises(BackendError, match=f"broke off the log of pod {pod.name} after 2 lines"):
        for line in backend.follow_log(target_of(pod), tail=5):
            seen.append(line.text)
    assert seen == ["step 1", "step 2"]


def test_follow_that_cannot_open_its_stream_is_a_backend_error(
    backend: KubernetesBackend, fake: FakeApiServer
) -> None:
    pod = running_pod(backend, fake)
    # The connection is reset before any answer (a "timeout" fault that does not wait).
    fake.inject("timeout", f"/pods/{pod.name}/log", delay_s=0)
    with pytest.raises(BackendError, match=f"could not be asked for the log of pod {pod.name}"):
        list(backend.follow_log(target_of(pod), tail=5))


def test_follow_of_a_pod_that_is_gone_says_so(
    backend: KubernetesBackend, fake: FakeApiServer
) -> None:
    pod = make_request()
    with pytest.raises(LogUnavailable, match="is gone"):
        list(backend.follow_log(target_of(pod), tail=5))
