"""The simulated cluster's utilization profiles per job type
(`scheduler.backends.simulated.cluster`): steady training, mostly idle interactive jobs,
stalls, the seed, the daily curve of inference (issue 20). Time is the fake clock's."""

from __future__ import annotations

import statistics

from scheduler.backends.base import PodRequest
from scheduler.backends.simulated.cluster import GPM_MODELS, STALL_SHARE, TDP_W, SimulatedCluster
from scheduler.backends.simulated.inventory import make_nodes
from tests.daemon.conftest import FakeClock

HOUR = 3600.0


def request(
    job_id: int, job_type: str, gpus: int = 1, node: str = "n-0000", hours: float = 10
) -> PodRequest:
    return PodRequest(
        name=f"gantry-{job_id}-a0-r0", namespace="ns", job_id=job_id, attempt=0, replica=0,
        replicas=1, node=node, gpu_indices=tuple(range(gpus)), gpu_milli=1000 * gpus,
        gpu_memory_mib=None, cpu_milli=1000, memory_mib=1024, image="img", command=(),
        env={}, priority_class="normal", job_type=job_type, sim_duration_s=hours * HOUR,
    )  # fmt: skip


def run_one(job_type: str, job_id: int, seed: int = 0, hours: float = 2.0) -> list[float]:
    """The utilization (%) of the device of one job, read every 30 s for `hours`."""
    clock = FakeClock()
    cluster = SimulatedCluster(make_nodes(1, "H100-80GB", 1, prefix="n"), clock=clock, seed=seed)
    pod = request(job_id, job_type, hours=hours + 1)
    cluster.create_pod(pod)
    cluster.bind_pod("ns", pod.name, "n-0000")
    clock.advance(cluster.start_delay_s)
    readings = []
    for _ in range(int(hours * HOUR / 30)):
        [reading] = cluster.device_readings()
        readings.append(reading.utilization_pct)
        clock.advance(30)
    return readings


def stalls(job_id: int, seed: int = 0) -> bool:
    cluster = SimulatedCluster([], seed=seed)
    return cluster.stall_at(request(job_id, "training"), 0.0) is not None


def test_training_runs_steady_and_high() -> None:
    job_id = next(j for j in range(1, 100) if not stalls(j))
    readings = run_one("training", job_id)
    assert statistics.mean(readings) > 85
    assert min(readings) > 80


def test_interactive_jobs_are_mostly_idle_with_bursts() -> None:
    readings = run_one("interactive", 7, hours=8)
    assert statistics.mean(readings) < 25
    assert sum(r < 5 for r in readings) / len(readings) > 0.6
    assert max(readings) > 30  # someone ran a cell


def test_some_jobs_stall_at_zero_and_stay_there() -> None:
    stalled = [j for j in range(1, 400) if stalls(j)]
    # About STALL_SHARE of jobs stall, decided by the seed.
    assert 0.5 * STALL_SHARE < len(stalled) / 399 < 2 * STALL_SHARE
    readings = run_one("training", stalled[0], hours=1)
    assert readings[0] > 80  # busy first
    assert readings[-20:] == [0.0] * 20  # then hung (within ten minutes of the start)


def test_the_profiles_follow_the_seed() -> None:
    assert run_one("interactive", 3, seed=1) == run_one("interactive", 3, seed=1)
    assert run_one("interactive", 3, seed=1) != run_one("interactive", 3, seed=2)
    assert [j for j in range(1, 200) if stalls(j, 1)] != [j for j in range(1, 200) if stalls(j, 2)]


def test_a_free_device_reads_idle_and_hopper_reports_sm_activity() -> None:
    cluster = SimulatedCluster(make_nodes(1, "H100-80GB", 2, prefix="n"), clock=FakeClock())
    other = SimulatedCluster(make_nodes(1, "A100-40GB", 1, prefix="a"), clock=FakeClock())
    first, second = cluster.device_readings()
    assert (first.utilization_pct, first.memory_used_mib, first.sm_active_pct) == (0.0, 0, 0.0)
    assert second.index == 1
    [a100] = other.device_readings()
    assert a100.sm_active_pct is None  # no GPM before Hopper


def test_an_idle_device_reads_as_the_general_reading_of_no_pods() -> None:
    """Idle devices (most of a large cluster) take a short path; it gives what the reading
    of a device with no pods gives, on every flavor family (power by TDP, GPM or not)."""
    for flavor in ("H100-80GB", "A100-40GB", "L40S", "unknown-card"):
        cluster = SimulatedCluster(make_nodes(1, flavor, 2, prefix="n"), clock=FakeClock())
        readings = cluster.device_readings()
        info = make_nodes(1, flavor, 2, prefix="n")[0]
        tdp = next((w for family, w in TDP_W.items() if family in flavor), 300.0)
        hopper = any(family in flavor for family in GPM_MODELS)
        general = [
            cluster._reading(info.name, g.index, g.memory_mib, [], 0.0, tdp, hopper)
            for g in info.gpus
        ]
        assert readings == general, flavor
    assert cluster.idle("n", 0, 700.0, True).power_w == 70.0


def test_a_node_is_listed_as_the_same_object_until_it_changes() -> None:
    cluster = SimulatedCluster(make_nodes(2, "H100-80GB", 1, prefix="n"), clock=FakeClock())
    first = cluster.list_nodes()
    again = cluster.list_nodes()
    assert all(a is b for a, b in zip(first, again, strict=True))
    cluster.fail_node("n-0000")
    failed, other = cluster.list_nodes()
    assert failed is not first[0] and failed.ready is False
    assert other is first[1]
    cluster.heal_node("n-0000")
    healed, _ = cluster.list_nodes()
    assert healed.ready is True


def test_a_failed_node_reports_nothing() -> None:
    cluster = SimulatedCluster(make_nodes(2, "H100-80GB", 1, prefix="n"), clock=FakeClock())
    cluster.fail_node("n-0000")
    assert [r.node for r in cluster.device_readings()] == ["n-0001"]


def hourly_load(cluster: SimulatedCluster, job_id: int, midnight: float) -> list[float]:
    """The job's mean inference load over each UTC hour of the day starting at `midnight`."""
    return [
        statistics.mean(
            cluster.inference_load(job_id, midnight + h * HOUR + s) for s in range(0, 3600, 300)
        )
        for h in range(24)
    ]


def test_inference_follows_a_daily_curve_low_at_night_and_high_by_day() -> None:
    # 1_900_022_400 is a UTC midnight (a multiple of 86,400 s).
    midnight = 1_900_022_400.0
    cluster = SimulatedCluster([], seed=0)
    for job_id in (1, 2, 17, 99):
        hours = hourly_load(cluster, job_id, midnight)
        night = statistics.mean(hours[1:6])  # 01:00-06:00
        day = statistics.mean(hours[13:18])  # 13:00-18:00
        assert day > 2 * night, (job_id, hours)
        assert all(0.5 <= load <= 4.5 for load in hours)
        # The same hour the next day reads about the same: a 24 h period, not a short wave.
        tomorrow = hourly_load(cluster, job_id, midnight + 24 * HOUR)
        assert all(abs(a - b) < 0.5 for a, b in zip(hours, tomorrow, strict=True))


def test_inference_load_is_deterministic_per_job_and_time_with_noise() -> None:
    first, again = SimulatedCluster([], seed=3), SimulatedCluster([], seed=3)
    at = 1_900_022_400.0 + 14 * HOUR
    assert first.inference_load(5, at) == again.inference_load(5, at)
    # Noise: ten 5-minute slots of one afternoon hour do not all read alike.
    assert len({round(first.inference_load(5, at + 300 * k), 6) for k in range(10)}) > 5


def test_an_inference_jobs_utilization_is_lower_at_night() -> None:
    # The pod serves for 24 hours from the fake clock's start; its device at night vs by day.
    readings = run_one("inference", 11, hours=24)
    start = FakeClock().t + SimulatedCluster([]).start_delay_s
    hour_of = [int(((start + 30 * i) % 86400) // 3600) for i in range(len(readings))]
    night = [r for r, h in zip(readings, hour_of, strict=True) if 1 <= h < 6]
    day = [r for r, h in zip(readings, hour_of, strict=True) if 13 <= h < 18]
    assert statistics.mean(night) < statistics.mean(day)
