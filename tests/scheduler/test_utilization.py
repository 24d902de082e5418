"""Utilization history (issue 20): samples attributed at ingest, roll-ups worked out,
retention, and the node agent's reports as samples."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduler.models import (
    AllocationDevice,
    GpuDevice,
    JobState,
    RollupWatermark,
    UtilizationRollup,
    UtilizationSample,
)
from scheduler.telemetry import samples as utilization
from scheduler.telemetry.rollups import LAG, _roll_window, retention_run, rollup_run
from scheduler.telemetry.samples import BATCH, DeviceReading, holders_of, samples_ingest
from tenants.models import IdleRule
from tests.billing.builders import T0, at, hold, job_for, make_node
from tests.conftest import Org

pytestmark = pytest.mark.django_db


def release(allocation: Any, when: datetime) -> None:
    AllocationDevice.objects.filter(allocation=allocation).update(released=True)
    allocation.ended_at = when
    allocation.save(update_fields=["ended_at"])


def device(node: Any, index: int = 0) -> GpuDevice:
    return GpuDevice.objects.get(node=node, index=index)


def test_a_sample_stays_with_the_job_that_held_the_device_when_it_was_written(org: Org) -> None:
    node = make_node("n1", gpus=2)
    first = job_for(org, state=JobState.RUNNING)
    second = job_for(org, "bob-bravo", project=org.proj_bravo, state=JobState.RUNNING)
    held = hold(first, node, 0, None, [1000])
    d0, d1 = device(node, 0), device(node, 1)
    samples_ingest([DeviceReading(d0.id, 97.0), DeviceReading(d1.id, 0.0)], at=at(0.5))
    # The device changes hands: the earlier sample is not re-attributed.
    release(held, at(0.6))
    hold(second, node, 0.6, None, [1000])
    samples_ingest([DeviceReading(d0.id, 40.0, memory_used_mib=512, power_w=300.0)], at=at(0.7))
    rows = list(
        UtilizationSample.objects.order_by("at", "device_id").values_list(
            "at", "device_id", "job_id", "tenant_id", "project_id", "share_milli", "flavor"
        )
    )
    assert rows == [
        (at(0.5), d0.id, first.id, org.alpha.id, org.proj_alpha.id, 1000, "H100-80GB"),
        (at(0.5), d1.id, None, None, None, 0, "H100-80GB"),  # free device: nobody's
        (at(0.7), d0.id, second.id, org.bravo.id, org.proj_bravo.id, 1000, "H100-80GB"),
    ]


def test_a_shared_device_is_attributed_to_its_largest_share(org: Org) -> None:
    node = make_node("n1", gpus=1)
    small = job_for(org, state=JobState.RUNNING)
    large = job_for(org, "bob-bravo", project=org.proj_bravo, state=JobState.RUNNING)
    hold(small, node, 0, None, [250])
    hold(large, node, 0, None, [750], replica=0)
    samples_ingest([DeviceReading(device(node).id, 50.0)], at=at(0.1))
    sample = UtilizationSample.objects.get()
    assert (sample.job_id, sample.share_milli) == (large.id, 750)


def test_a_large_round_is_written_whole_in_one_copy_on_postgresql(org: Org) -> None:
    """More readings than one INSERT's batch (the simulated cluster's 5,000 nodes report
    40,000): on PostgreSQL one COPY and no INSERT, elsewhere inserts in batches; every
    field as given either way (devices are not enforced references, so ids stand alone)."""
    node = make_node("n1", gpus=1)
    job = job_for(org, state=JobState.RUNNING)
    hold(job, node, 0, None, [500])
    held = device(node).id
    readings = [DeviceReading(held, 12.5, memory_used_mib=640, power_w=None, sm_active_pct=3.0)]
    readings += [DeviceReading(held + 1 + i, float(i % 100)) for i in range(BATCH)]
    with CaptureQueriesContext(connection) as queries:
        written = samples_ingest(readings, at=at(0.2), flavors={held: "H100-80GB"})
    inserts = [q for q in queries if q["sql"].lstrip().upper().startswith("INSERT")]
    assert bool(inserts) is (connection.vendor != "postgresql")
    assert written == UtilizationSample.objects.count() == BATCH + 1
    first = UtilizationSample.objects.get(device_id=held)
    assert (first.at, first.flavor, first.utilization_pct, first.memory_used_mib) == (
        at(0.2),
        "H100-80GB",
        12.5,
        640,
    )
    assert (first.power_w, first.temperature_c, first.sm_active_pct) == (None, None, 3.0)
    assert (first.job_id, first.tenant_id, first.project_id, first.share_milli) == (
        job.id,
        org.alpha.id,
        org.proj_alpha.id,
        500,
    )
    last = UtilizationSample.objects.get(device_id=held + BATCH)
    assert (last.utilization_pct, last.flavor, last.job_id, last.share_milli) == (
        float((BATCH - 1) % 100),
        "",
        None,
        0,
    )


@pytest.mark.parametrize("by_id_max", [1000, 0])
def test_holders_are_the_same_asked_by_id_or_read_whole(
    org: Org, monkeypatch: pytest.MonkeyPatch, by_id_max: int
) -> None:
    """Past BY_ID_MAX devices (a whole cluster's round) every live share is read and
    filtered here: the same holders, and none for a held device not asked about."""
    monkeypatch.setattr(utilization, "BY_ID_MAX", by_id_max)
    node = make_node("n1", gpus=3)
    small = job_for(org, state=JobState.RUNNING)
    large = job_for(org, "bob-bravo", project=org.proj_bravo, state=JobState.RUNNING)
    hold(small, node, 0, None, [250])
    hold(large, node, 0, None, [750, 1000], replica=0)
    ended = hold(small, node, 0, None, [1000], first_device=2, replica=1)
    release(ended, at(0.1))
    d0, d1, d2 = device(node, 0), device(node, 1), device(node, 2)
    found = holders_of([d0.id, d2.id])
    assert {d: (h.job_id, h.share_milli) for d, h in found.items()} == {d0.id: (large.id, 750)}
    assert d1.id not in found  # held, not asked about


def window_samples(org: Org) -> tuple[Any, Any]:
    """Ten samples 30 s apart in the 5-minute window at T0 on device 0, held by one job of
    team-alpha: utilization 0, 10, ..., 90 %."""
    node = make_node("n1", gpus=1)
    job = job_for(org, state=JobState.RUNNING)
    hold(job, node, 0, None, [1000])
    d0 = device(node)
    for i in range(10):
        samples_ingest(
            [DeviceReading(d0.id, 10.0 * i, memory_used_mib=1000 * i, power_w=100.0 + i)],
            at=T0 + timedelta(seconds=30 * i),
        )
    return d0, job


def test_rollups_of_a_window_worked_out(org: Org) -> None:
    d0, job = window_samples(org)
    # The first 5-minute window and the hour; the empty windows after are skipped.
    assert rollup_run(now=T0 + timedelta(hours=1) + LAG) == 2
    five = UtilizationRollup.objects.filter(period="5m", start=T0)
    # Mean (0 + 10 + ... + 90) / 10 = 45; max 90; p95 by linear interpolation: rank
    # 0.95 x (10 - 1) = 8.55 between 80 and 90 -> 80 + 0.55 x 10 = 85.5. Memory mean 4500,
    # power mean 104.5. Allocated: 10 samples x 30 s x 1 GPU = 300 GPU-seconds; idle (under
    # alpha's default threshold of 5 %): the 0 % sample, 30 s.
    expected = (10, 45.0, 90.0, 85.5, 4500.0, 104.5, 300.0, 30.0)
    for scope, key in [("device", d0.id), ("job", job.id), ("tenant", job.tenant_id)]:
        row = five.get(scope=scope, key_id=key)
        got = (
            row.samples,
            row.utilization_mean,
            row.utilization_max,
            row.utilization_p95,
            row.memory_used_mean_mib,
            row.power_mean_w,
            row.gpu_seconds,
            row.idle_gpu_seconds,
        )
        assert got == pytest.approx(expected), scope
    flavor = five.get(scope="flavor", flavor="H100-80GB")
    assert (flavor.samples, flavor.utilization_mean) == (10, 45.0)
    job_row = five.get(scope="job", key_id=job.id)
    assert (job_row.tenant_id, job_row.project_id) == (org.alpha.id, org.proj_alpha.id)
    hour = UtilizationRollup.objects.get(period="1h", scope="job", key_id=job.id)
    assert hour.start == T0
    assert (hour.utilization_p95, hour.idle_gpu_seconds) == pytest.approx((85.5, 30.0))


def test_the_idle_share_follows_the_tenants_threshold(org: Org) -> None:
    IdleRule.objects.create(tenant=org.research, threshold_pct=25.0)
    _, job = window_samples(org)
    rollup_run(now=T0 + timedelta(minutes=5) + LAG)
    row = UtilizationRollup.objects.get(period="5m", scope="job", key_id=job.id)
    assert row.idle_gpu_seconds == 90.0  # 0, 10 and 20 % are under research's 25 %


def test_rollups_are_done_once_however_often_they_run(org: Org) -> None:
    window_samples(org)
    now = T0 + timedelta(hours=1) + LAG
    rollup_run(now=now)
    count = UtilizationRollup.objects.count()
    assert rollup_run(now=now) == 0
    assert UtilizationRollup.objects.count() == count == 8  # 4 scopes x (5 min + 1 h)


def test_a_concurrent_run_behind_the_watermark_does_not_roll_a_window_again(org: Org) -> None:
    """Two runs at once: the second read the watermark at T0 before the first committed. Once
    it holds the watermark's lock it finds the window done, and leaves it."""
    window_samples(org)
    now = T0 + timedelta(minutes=5) + LAG
    rollup_run(now=now)
    rows = list(UtilizationRollup.objects.values_list("id", flat=True))
    assert _roll_window("5m", T0, T0 + timedelta(minutes=5), 30.0) is False
    assert list(UtilizationRollup.objects.values_list("id", flat=True)) == rows


def test_an_open_window_waits(org: Org) -> None:
    window_samples(org)
    # The 5-minute window ends at T0 + 5 min; LAG later it may still get late samples.
    assert rollup_run(now=T0 + timedelta(minutes=5) + LAG - timedelta(seconds=1)) == 0
    assert not UtilizationRollup.objects.exists()


def test_retention_deletes_raw_samples_past_48_hours_and_keeps_the_rollups(org: Org) -> None:
    node = make_node("n1", gpus=1)
    d0 = device(node)
    now = T0 + timedelta(hours=50)
    old, recent = now - timedelta(hours=49), now - timedelta(hours=2)
    samples_ingest([DeviceReading(d0.id, 60.0)], at=old)
    samples_ingest([DeviceReading(d0.id, 70.0)], at=recent)
    while rollup_run(now=now):
        pass
    kept_rollups = UtilizationRollup.objects.count()
    assert kept_rollups == 8  # 2 samples x 2 scopes (device, flavor) x 2 periods
    deleted = retention_run(now=now)
    assert deleted["raw"] == 1
    assert list(UtilizationSample.objects.values_list("at", flat=True)) == [recent]
    assert UtilizationRollup.objects.count() == kept_rollups


def test_retention_keeps_raw_samples_not_rolled_up_yet(org: Org) -> None:
    node = make_node("n1", gpus=1)
    now = T0 + timedelta(hours=50)
    samples_ingest([DeviceReading(device(node).id, 60.0)], at=now - timedelta(hours=49))
    assert retention_run(now=now)["raw"] == 0  # no roll-up ran: it is all there is
    assert UtilizationSample.objects.count() == 1


def test_retention_waits_for_rollups_that_lag_behind(org: Org) -> None:
    node = make_node("n1", gpus=1)
    now = T0 + timedelta(hours=50)
    samples_ingest([DeviceReading(device(node).id, 60.0)], at=now - timedelta(hours=49))
    # The hourly roll-up is stuck before the sample (a worker down for two days).
    RollupWatermark.objects.create(name="5m", done_until=now)
    RollupWatermark.objects.create(name="1h", done_until=now - timedelta(hours=50))
    assert retention_run(now=now)["raw"] == 0
    assert UtilizationSample.objects.count() == 1


def test_retention_of_rollups_per_period(org: Org, settings: Any) -> None:
    settings.GANTRY_UTILIZATION_5M_DAYS = 30
    settings.GANTRY_UTILIZATION_1H_DAYS = 400
    now = T0
    common = {"scope": "flavor", "flavor": "H100-80GB", "samples": 1, "utilization_mean": 1,
              "utilization_max": 1, "utilization_p95": 1}  # fmt: skip
    for period, days in [("5m", 29), ("5m", 31), ("1h", 31), ("1h", 401)]:
        UtilizationRollup.objects.create(period=period, start=now - timedelta(days=days), **common)
    RollupWatermark.objects.create(name="5m", done_until=now)
    RollupWatermark.objects.create(name="1h", done_until=now)
    deleted = retention_run(now=now)
    assert (deleted["5m"], deleted["1h"]) == (1, 1)
    left = sorted(
        (p, (now - s).days) for p, s in UtilizationRollup.objects.values_list("period", "start")
    )
    assert left == [("1h", 31), ("5m", 29)]


# --- the node agent's reports ------------------------------------------------------------


def agent_report(node: str, utilization: float) -> dict[str, Any]:
    gpu = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3",
           "memory_total_mib": 81559, "memory_used_mib": 2048, "utilization_pct": utilization,
           "temperature_c": 61.0, "ecc_uncorrected": 0, "xid_errors": [], "healthy": True,
           "power_w": 412.5, "sm_active_pct": None}  # fmt: skip
    return {"node": node, "driver_version": "550.54.15", "gpus": [gpu]}


def test_an_agent_report_is_one_sample_per_device_attributed_and_bursts_absorbed(
    org: Org, client_for: Any, settings: Any
) -> None:
    settings.GANTRY_UTILIZATION_SAMPLE_S = 30
    node = make_node("n1", gpus=1)
    job = job_for(org, state=JobState.RUNNING)
    hold(job, node, 0, None, [1000])
    admin = client_for("pat")
    url = "/api/v1/nodes/report/"
    assert admin.post(url, agent_report("n1", 88.0), format="json").status_code == 200
    # A second report at once (a retry storm) updates the device but adds no sample.
    assert admin.post(url, agent_report("n1", 12.0), format="json").status_code == 200
    sample = UtilizationSample.objects.get()
    assert (sample.job_id, sample.utilization_pct, sample.power_w, sample.sm_active_pct) == (
        job.id,
        88.0,
        412.5,
        None,
    )
    assert device(node).utilization_pct == 12.0
    # Half an interval later the next report is a sample again.
    GpuDevice.objects.filter(node=node).update(reported_at=timezone.now() - timedelta(seconds=16))
    assert admin.post(url, agent_report("n1", 13.0), format="json").status_code == 200
    assert UtilizationSample.objects.count() == 2


def test_an_agent_report_out_of_range_is_refused_and_writes_no_sample(
    org: Org, client_for: Any
) -> None:
    make_node("n1", gpus=1)
    body = agent_report("n1", 50.0)
    body["gpus"][0]["power_w"] = -3
    response = client_for("pat").post("/api/v1/nodes/report/", body, format="json")
    assert response.status_code == 400
    assert "power_w" in str(response.json()["errors"])
    assert not UtilizationSample.objects.exists()


def test_an_old_agent_without_power_still_reports(org: Org) -> None:
    make_node("n1", gpus=1)
    body = agent_report("n1", 50.0)
    del body["gpus"][0]["power_w"], body["gpus"][0]["sm_active_pct"]
    client = Client()
    client.force_login(org.users["pat"])
    response = client.post("/api/v1/nodes/report/", body, content_type="application/json")
    assert response.status_code == 200
    assert UtilizationSample.objects.get().power_w is None


def test_the_beat_task_rolls_up_and_scans(org: Org, settings: Any) -> None:
    from config.celery import app
    from scheduler import tasks

    entry = settings.CELERY_BEAT_SCHEDULE["utilization-rollup"]
    app.loader.import_default_modules()
    assert entry["task"] in app.tasks
    node = make_node("n1", gpus=1)
    job = job_for(org, state=JobState.RUNNING)
    hold(job, node, 0, None, [1000])
    hour_ago = timezone.now() - timedelta(hours=1)
    samples_ingest([DeviceReading(device(node).id, 1.0)], at=hour_ago)
    done = tasks.utilization_rollup()
    assert done["windows"] >= 1 and done["idle_samples"] == 1
    assert UtilizationRollup.objects.filter(period="5m", scope="job", key_id=job.id).exists()
