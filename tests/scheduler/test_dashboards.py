"""The dashboards' data (issue 20): the queue's 5-minute snapshots and the selectors that read
the roll-ups and snapshots for the cluster, a tenant and a job."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from scheduler.models import GpuDevice, JobEvent, JobState, QueueSnapshot
from scheduler.telemetry.dashboards import (
    cluster_dashboard,
    queue_points,
    tenant_dashboard,
    window_for,
)
from scheduler.telemetry.job_dashboard import job_utilization
from scheduler.telemetry.queue_history import queue_snapshot_take, wait_bucket
from scheduler.telemetry.rollups import LAG, retention_run, rollup_run
from scheduler.telemetry.samples import DeviceReading, samples_ingest
from tests.billing.builders import T0, hold, job_for, make_node
from tests.conftest import Org

pytestmark = pytest.mark.django_db


def event(job: Any, when: Any, to_state: str, from_state: str = "", **kw: Any) -> JobEvent:
    row = JobEvent.objects.create(job=job, kind=kw.pop("kind", "state"), to_state=to_state, **kw)
    row.from_state = from_state
    row.at = when
    row.save(update_fields=["at", "from_state"])
    return row


def busy_hour(org: Org) -> tuple[Any, Any]:
    """Two H100 devices for an hour from T0, one held by a running job of team-alpha at
    80 %, the other free at 0 %; rolled up."""
    node = make_node("n1", gpus=2)
    job = job_for(org, state=JobState.RUNNING, started_at=T0)
    hold(job, node, 0, None, [1000])
    held, free = GpuDevice.objects.filter(node=node).order_by("index")
    for i in range(120):
        samples_ingest(
            [DeviceReading(held.id, 80.0, memory_used_mib=4000), DeviceReading(free.id, 0.0)],
            at=T0 + timedelta(seconds=30 * i),
        )
    while rollup_run(now=T0 + timedelta(hours=1) + LAG):
        pass
    return job, node


def test_the_queue_snapshot_counts_the_queue_and_the_waits_of_its_window(org: Org) -> None:
    waiting = job_for(org, state=JobState.QUEUED)
    admitted = job_for(org, "bob-bravo", project=org.proj_bravo, state=JobState.RUNNING)
    event(admitted, T0 - timedelta(minutes=30), JobState.QUEUED)
    event(admitted, T0 + timedelta(minutes=1), JobState.ADMITTED, JobState.QUEUED)
    make_node("n1", gpus=2)
    # Taken in the next window: it describes [T0, T0 + 5 min).
    assert queue_snapshot_take(now=T0 + timedelta(minutes=6)) is True
    assert queue_snapshot_take(now=T0 + timedelta(minutes=7)) is False  # once a window
    cluster = QueueSnapshot.objects.get(tenant__isnull=True)
    # The admission waited 31 minutes = 1860 s: Kueue's bucket <= 2048 s (index 11).
    assert (cluster.at, cluster.queued_jobs, cluster.admissions) == (T0, 1, 1)
    assert cluster.wait_sum_s == 1860.0 and cluster.wait_buckets[wait_bucket(1860)] == 1
    assert wait_bucket(1860) == 11
    assert cluster.flavors == {"H100-80GB": [2.0, 0.0]}
    alpha = QueueSnapshot.objects.get(tenant=waiting.tenant)
    bravo = QueueSnapshot.objects.get(tenant=admitted.tenant)
    assert (alpha.queued_jobs, alpha.admissions, bravo.queued_jobs, bravo.admissions) == (
        1,
        0,
        0,
        1,
    )


def test_queue_snapshots_are_kept_as_long_as_the_five_minute_rollups(
    org: Org, settings: Any
) -> None:
    queue_snapshot_take(now=T0)
    settings.GANTRY_UTILIZATION_5M_DAYS = 30
    assert retention_run(now=T0 + timedelta(days=29))["queue"] == 0
    assert retention_run(now=T0 + timedelta(days=31))["queue"] == 1


def test_queue_points_keep_the_largest_reading_and_add_up_admissions() -> None:
    buckets = [0] * 15
    buckets[3], buckets[14] = 1, 1  # a wait under 8 s, and one over 8192 s
    readings = [(T0, 4, 8.0), (T0 + timedelta(minutes=5), 6, 6.0)]
    (point,) = queue_points(readings, [(T0, 2, 9005.0, buckets)], timedelta(hours=1))
    # The peak reading (6 jobs) with its GPUs; two admissions, mean (5 + 9000) / 2.
    assert (point.queued_jobs, point.queued_gpus, point.admissions) == (6, 6.0, 2)
    assert point.wait_mean_s == 4502.5
    assert point.wait_p95_s == float("inf")  # the 95th percentile is the long wait


def test_an_hourly_range_sums_the_snapshots_waits_in_the_database(org: Org) -> None:
    job = job_for(org, state=JobState.QUEUED)
    for minutes, wait in [(0, 3.0), (30, 100.0)]:
        buckets = [0] * 15
        buckets[2 if wait < 5 else 7] = 1
        for tenant in (None, job.tenant_id):
            QueueSnapshot.objects.create(
                at=T0 + timedelta(minutes=minutes),
                tenant_id=tenant,
                queued_jobs=2,
                admissions=1,
                wait_sum_s=wait,
                wait_buckets=buckets,
            )
    (hour,) = cluster_dashboard(window_for("7d", T0 + timedelta(hours=1))).queue
    # Two admissions of the hour, waits 3 s and 100 s: mean 51.5; p95 in the bucket <= 128 s.
    assert (hour.start, hour.admissions, hour.wait_mean_s, hour.wait_p95_s) == (T0, 2, 51.5, 128.0)
    fives = cluster_dashboard(window_for("6h", T0 + timedelta(minutes=35))).queue
    assert [(p.start, p.admissions, p.wait_mean_s) for p in fives] == [
        (T0, 1, 3.0),
        (T0 + timedelta(minutes=30), 1, 100.0),
    ]
    tenant = tenant_dashboard(org.alpha, window_for("7d", T0 + timedelta(hours=1))).queue
    assert [(p.admissions, p.queued_jobs) for p in tenant] == [(2, 2)]


def test_a_bad_range_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'1y' is not a range"):
        window_for("1y", T0)


def test_the_cluster_dashboard_reads_allocated_and_used_gpus_from_the_rollups(org: Org) -> None:
    job, _node = busy_hour(org)
    JobEvent.objects.create(job=job, kind="attempt_failed", data={"reason": "OOMKilled"})
    JobEvent.objects.filter(kind="attempt_failed").update(at=T0 + timedelta(minutes=10))
    dash = cluster_dashboard(window_for("24h", T0 + timedelta(hours=1)))
    points = dash.capacity["H100-80GB"]
    assert len(points) == 12  # twelve 5-minute windows
    # Each window: 1 GPU held all the time; 2 devices at a mean of (80 + 0) / 2 = 40 % make
    # 0.8 busy GPU-equivalents.
    assert {(p.allocated, round(p.used, 6)) for p in points} == {(1.0, 0.8)}
    assert dash.failures == [("OOMKilled", 1)]
    (idle,) = [] or dash.idle or [None]
    assert idle is None  # 80 % is not idle
    assert not dash.empty


def test_the_cluster_dashboard_is_empty_without_history(org: Org) -> None:
    dash = cluster_dashboard(window_for("6h", T0))
    assert dash.empty and dash.capacity == {} and dash.queue == []


def test_the_tenant_dashboard_sets_usage_against_its_quota(org: Org) -> None:
    busy_hour(org)
    # team-alpha: 16 GPUs guaranteed, 32 limit; its subtree used 1 GPU: 15 left lendable.
    dash = tenant_dashboard(org.alpha, window_for("7d", T0 + timedelta(hours=1)))
    (point,) = dash.usage["H100-80GB"]
    assert (point.used, point.borrowed, point.lent) == (1.0, 0.0, 15.0)
    assert dash.quotas["H100-80GB"].limit == 32.0
    # research holds team-alpha: its subtree's use is counted.
    research = tenant_dashboard(org.research, window_for("7d", T0 + timedelta(hours=1)))
    assert research.usage["H100-80GB"][0].used == 1.0
    # team-bravo ran nothing.
    assert tenant_dashboard(org.bravo, window_for("7d", T0 + timedelta(hours=1))).empty


def test_the_job_utilization_follows_its_rollups(org: Org) -> None:
    job, _node = busy_hour(org)
    util = job_utilization(job, now=T0 + timedelta(hours=1))
    (device,) = util.devices
    assert device.label == "n1 / GPU 0" and len(device.points) == 12
    assert {(p.utilization_mean, p.memory_mib) for p in device.points} == {(80.0, 4000.0)}
    other = job_for(org, state=JobState.QUEUED)
    assert job_utilization(other, now=T0).empty


def test_the_job_utilization_draws_each_device_only_while_the_job_held_it(org: Org) -> None:
    """Attempt 0 held GPU 0 whole for the first half hour, attempt 1 half of GPU 1 for the
    second; another job held GPU 2 all along. Each device's line is its own roll-ups, within
    the job's allocation of it: 6 five-minute windows each, nothing of GPU 2."""
    node = make_node("n1", gpus=3)
    job = job_for(org, state=JobState.RUNNING, started_at=T0)
    hold(job, node, 0, 0.5, [1000], attempt=0)
    hold(job, node, 0.5, None, [500], first_device=1, attempt=1)
    neighbour = job_for(org, "bob-bravo", project=org.proj_bravo, state=JobState.RUNNING)
    hold(neighbour, node, 0, None, [1000], first_device=2)
    d0, d1, d2 = GpuDevice.objects.filter(node=node).order_by("index")
    for i in range(120):
        readings = [DeviceReading(d0.id, 80.0), DeviceReading(d1.id, 40.0, memory_used_mib=900),
                    DeviceReading(d2.id, 10.0)]  # fmt: skip
        samples_ingest(readings, at=T0 + timedelta(seconds=30 * i))
    while rollup_run(now=T0 + timedelta(hours=1) + LAG):
        pass
    util = job_utilization(job, now=T0 + timedelta(hours=1))
    drawn = {d.label: d.points for d in util.devices}
    assert set(drawn) == {"n1 / GPU 0", "n1 / GPU 1 (0.5 GPU)"}
    assert [p.start for p in drawn["n1 / GPU 0"]] == [
        T0 + timedelta(minutes=m) for m in range(0, 30, 5)
    ]
    assert [p.start for p in drawn["n1 / GPU 1 (0.5 GPU)"]] == [
        T0 + timedelta(minutes=m) for m in range(30, 60, 5)
    ]
    assert {p.utilization_mean for p in drawn["n1 / GPU 0"]} == {80.0}
    assert {(p.utilization_mean, p.memory_mib) for p in drawn["n1 / GPU 1 (0.5 GPU)"]} == {
        (40.0, 900.0)
    }
    assert util.devices_held == 2


def test_the_rollup_task_writes_the_last_windows_queue_snapshot(org: Org, monkeypatch: Any) -> None:
    from django.utils import timezone

    from scheduler.tasks import utilization_rollup

    monkeypatch.setattr(timezone, "now", lambda: T0 + timedelta(minutes=6))  # an injected clock
    job_for(org, state=JobState.QUEUED)
    assert utilization_rollup()["queue_snapshot"] is True
    assert utilization_rollup()["queue_snapshot"] is False  # once a window
    cluster = QueueSnapshot.objects.get(tenant__isnull=True)
    assert (cluster.at, cluster.queued_jobs) == (T0, 1)
