"""Bounded backoff with jitter, and which failures count as transient (docs/faults.md 12)."""

from __future__ import annotations

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from scheduler.backends.base import BackendError
from scheduler.backends.kubernetes.transient import as_backend_error, call_with_retry
from scheduler.backends.retry import RetryPolicy
from tests.k8s.conftest import Sleeps


def api_error(status: int, retry_after: str | None = None) -> ApiException:
    exc = ApiException(status=status, reason="x")
    exc.headers = {"Retry-After": retry_after} if retry_after else {}
    return exc


class Flaky:
    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


@pytest.mark.parametrize(
    "error",
    [
        api_error(429, "1"),
        api_error(500),
        api_error(503),
        api_error(0),
        urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"),  # type: ignore[arg-type]
        urllib3.exceptions.ProtocolError("reset", ConnectionResetError()),
        ConnectionResetError(),
    ],
    ids=["429", "500", "503", "status-0", "timeout", "protocol", "reset"],
)
def test_transient_errors_are_retried(error: BaseException) -> None:
    fn, sleeps = Flaky(error), Sleeps()
    assert call_with_retry(fn, RetryPolicy(), sleep=sleeps, rand=lambda: 1.0) == "ok"
    assert fn.calls == 2 and len(sleeps.delays) == 1


@pytest.mark.parametrize("status", [400, 403, 404, 409, 422])
def test_answers_are_not_retried(status: int) -> None:
    fn = Flaky(api_error(status))
    with pytest.raises(ApiException):
        call_with_retry(fn, RetryPolicy(), sleep=Sleeps())
    assert fn.calls == 1
    assert as_backend_error(api_error(status)) is None


def test_backoff_is_bounded_exponential_with_jitter() -> None:
    # attempt n sleeps rand() * min(cap, base * 2**n): 0.5 * (0.1, 0.2, 0.4, 0.8, 1.0 capped)
    fn, sleeps = Flaky(*[api_error(503)] * 6), Sleeps()
    policy = RetryPolicy(attempts=6, base_s=0.1, cap_s=1.0)
    with pytest.raises(BackendError) as raised:
        call_with_retry(fn, policy, sleep=sleeps, rand=lambda: 0.5)
    assert sleeps.delays == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.5])
    assert fn.calls == 6
    assert isinstance(raised.value.__cause__, ApiException)


def test_retry_after_is_honoured_and_a_long_one_goes_up_to_the_daemon() -> None:
    fn, sleeps = Flaky(api_error(429, "2")), Sleeps()
    call_with_retry(fn, RetryPolicy(cap_s=2.0), sleep=sleeps, rand=lambda: 0.0)
    assert sleeps.delays == [2.0]

    fn, sleeps = Flaky(api_error(429, "60")), Sleeps()
    with pytest.raises(BackendError) as raised:
        call_with_retry(fn, RetryPolicy(cap_s=2.0), sleep=sleeps)
    assert raised.value.retry_after_s == 60.0
    assert fn.calls == 1 and sleeps.delays == []
