"""Issue 37: the client-side rate of a backend's API calls (`--kube-api-qps`/`--kube-api-burst`)."""

from __future__ import annotations

import threading

import pytest

from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.rate import TokenBucket


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_burst_goes_at_once_then_calls_are_paced_at_qps() -> None:
    t = FakeTime()
    bucket = TokenBucket(10, 3, clock=t.clock, sleep=t.sleep)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    waits = [bucket.take() for _ in range(4)]
    assert waits == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert t.now == pytest.approx(0.4)  # 7 calls at 10/s after a burst of 3


def test_tokens_come_back_while_idle_up_to_the_burst() -> None:
    t = FakeTime()
    bucket = TokenBucket(10, 2, clock=t.clock, sleep=t.sleep)
    for _ in range(2):
        bucket.take()
    t.now += 60  # a long pause refills two tokens, not six hundred
    assert [bucket.take() for _ in range(3)] == pytest.approx([0.0, 0.0, 0.1])


def test_threads_queue_behind_one_another() -> None:
    """Four threads share a bucket with no token left: their waits are 0.1, 0.2, 0.3 and
    0.4 s, whatever the order (each pays for the calls taken before it)."""
    bucket = TokenBucket(10, 1, sleep=lambda _s: None)
    bucket.take()
    waits: list[float] = []
    threads = [threading.Thread(target=lambda: waits.append(bucket.take())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(waits) == pytest.approx([0.1, 0.2, 0.3, 0.4], abs=0.02)


def test_qps_zero_is_no_limit() -> None:
    bucket = TokenBucket(0, 0, sleep=lambda _s: pytest.fail("slept"))
    assert sum(bucket.take() for _ in range(1000)) == 0.0


def test_a_burst_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="burst must be at least 1"):
        TokenBucket(5, 0)


def test_the_settings_come_from_the_environment_and_bad_ones_name_the_variable() -> None:
    config = KubernetesConfig.from_env(
        {
            "GANTRY_K8S_API_QPS": "50",
            "GANTRY_K8S_API_BURST": "100",
            "GANTRY_K8S_MAX_IN_FLIGHT": "8",
            "GANTRY_K8S_CREATE_BOUND": "false",
            "GANTRY_K8S_NODE_WATCH_S": "30",
        }
    )
    assert (config.api_qps, config.api_burst, config.max_in_flight) == (50.0, 100, 8)
    assert (config.node_watch_s, KubernetesConfig.from_env({}).node_watch_s) == (30, 60)
    assert config.create_bound is False
    assert KubernetesConfig.from_env({}).create_bound is True
    for name, value, message in (
        ("GANTRY_K8S_API_QPS", "fast", "GANTRY_K8S_API_QPS: 'fast' is not a number"),
        ("GANTRY_K8S_MAX_IN_FLIGHT", "0", "GANTRY_K8S_MAX_IN_FLIGHT: 0 is below 1"),
        ("GANTRY_K8S_CREATE_BOUND", "maybe", "GANTRY_K8S_CREATE_BOUND: 'maybe' is not true"),
        ("GANTRY_K8S_NODE_WATCH_S", "0", "GANTRY_K8S_NODE_WATCH_S: 0 is below 1"),
    ):
        with pytest.raises(ValueError, match=message):
            KubernetesConfig.from_env({name: value})
