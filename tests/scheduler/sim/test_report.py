"""The report's arithmetic: percentiles, Jain's index, time averages; and determinism."""

from __future__ import annotations

import pytest

from scheduler.sim import Cluster, WorkloadJob, simulate
from scheduler.sim.measures import Percentiles, jain_index, time_average
from tests.scheduler.core.builders import BEST_FIT, CLASSES, make_job, make_node, make_tenants


@pytest.mark.parametrize(
    ("used", "entitled", "expected"),
    [
        # shares equal to entitlements: x = (1, 1) -> 1
        pytest.param({"a": 50, "b": 50}, {"a": 1, "b": 1}, 1.0, id="fair"),
        # a got all: x = (2, 0) but b used nothing and is left out -> one tenant -> 1
        pytest.param({"a": 100, "b": 0}, {"a": 1, "b": 1}, 1.0, id="idle-tenant-ignored"),
        # a 75, b 25 with equal entitlements: x = (1.5, 0.5): 2^2 / (2 x 2.5) = 0.8
        pytest.param({"a": 75, "b": 25}, {"a": 1, "b": 1}, 0.8, id="skewed"),
        # a entitled 3x b and used 3x: x = (1, 1) -> 1
        pytest.param({"a": 75, "b": 25}, {"a": 3, "b": 1}, 1.0, id="weighted-fair"),
    ],
)
def test_jain_index(used, entitled, expected):
    assert jain_index(used, entitled) == pytest.approx(expected)


def test_percentiles():
    p = Percentiles.of([float(v) for v in range(1, 101)])
    # numpy's linear interpolation: p50 of 1..100 = 50.5, p90 = 90.1, p99 = 99.01
    assert (p.count, p.mean, p.p50, p.p90, p.p99) == (
        100,
        50.5,
        50.5,
        pytest.approx(90.1),
        pytest.approx(99.01),
    )
    assert Percentiles.of([]).count == 0


def test_time_average_of_a_step_function():
    # 0 for 10 s, 4 for 30 s, 2 for 60 s: (0 + 120 + 120) / 100 = 2.4
    assert time_average([(0.0, 0.0), (10.0, 4.0), (40.0, 2.0)], 100.0) == pytest.approx(2.4)


def test_simulation_is_deterministic():
    tenants = make_tenants(("team-a", 8, None), ("team-b", 8, None))
    cluster = Cluster((make_node("n1"), make_node("n2")), tenants, CLASSES)
    work = [
        WorkloadJob(
            make_job(
                f"j{i}",
                ("team-a", "team-b")[i % 2],
                gpus=1 + i % 4,
                priority=("low", "normal", "high")[i % 3],
            ),
            i * 7.0,
            50.0 + i,
        )
        for i in range(30)
    ]
    first, second = simulate(work, cluster, BEST_FIT), simulate(work, cluster, BEST_FIT)
    assert first == second
    assert all(j.state == "succeeded" for j in first.jobs)
