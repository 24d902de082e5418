"""The forecast refresh: registered with Celery beat, one at a time, stored per pool and
subtree, a dead run failed, and the forecasts readable without fitting anything."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.utils import timezone

from capacity.models import ForecastRun, ForecastRunState, PoolForecast
from capacity.refresh import STALE_AFTER, forecast_refresh
from capacity.tasks import capacity_refresh
from tests import factories as f
from tests.capacity.builders import TODAY, day, job_at

pytestmark = pytest.mark.django_db

H100 = "H100-80GB"


@pytest.fixture(autouse=True)
def _short_history(settings) -> None:
    settings.GANTRY_CAPACITY_HISTORY_DAYS = 28
    settings.GANTRY_CAPACITY_HORIZON_DAYS = 30


def test_beat_runs_the_refresh_task() -> None:
    entry = django_settings.CELERY_BEAT_SCHEDULE["capacity-refresh"]
    assert entry["task"] == capacity_refresh.name
    assert entry["schedule"] == django_settings.GANTRY_CAPACITY_REFRESH_S


def test_a_refresh_stores_each_pool_and_subtree_with_its_band(org) -> None:
    for n in range(1, 28):  # one more GPU asked every day: growth to follow
        job_at(org.proj_alpha, created=day(-n), finished=day(-n + 1), gpus=n, flavors=[H100])
    f.NodeFactory.create_batch(2, flavor=H100)
    node = f.NodeFactory(flavor=H100)
    from scheduler.models import GpuDevice

    GpuDevice.objects.bulk_create(GpuDevice(node=node, index=i) for i in range(8))

    run = forecast_refresh(now=TODAY)

    assert run is not None and run.state == ForecastRunState.DONE
    assert run.last_day == day(-1).date()
    pool = PoolForecast.objects.get(run=run, flavor=H100, tenant=None)
    assert len(pool.requested) == 28 and len(pool.p50) == 30
    assert pool.requested[-1] == pytest.approx(24)  # day -1: one GPU for 24 hours
    assert all(lo <= mid <= hi for lo, mid, hi in zip(pool.p10, pool.p50, pool.p90, strict=True))
    assert pool.capacity_gpus == 8
    subtrees = set(PoolForecast.objects.filter(run=run).values_list("tenant__slug", flat=True))
    assert subtrees == {None, "acme", "research", "team-alpha"}


def test_the_task_body_refreshes(org) -> None:
    job_at(org.proj_alpha, created=day(-3), finished=day(-1), flavors=[H100])
    run_id = capacity_refresh.apply().get()
    assert ForecastRun.objects.get(pk=run_id).state == ForecastRunState.DONE
    assert PoolForecast.objects.filter(run_id=run_id, tenant=None, flavor=H100).exists()


def test_a_second_refresh_while_one_runs_does_nothing(org) -> None:
    ForecastRun.objects.create(
        started_at=TODAY, last_day=day(-1).date(), history_days=28, horizon_days=30
    )
    assert forecast_refresh(now=TODAY + timedelta(minutes=5)) is None
    assert ForecastRun.objects.count() == 1


def test_a_run_whose_worker_died_is_failed_and_the_refresh_goes_on(org) -> None:
    stale = ForecastRun.objects.create(
        started_at=TODAY, last_day=day(-1).date(), history_days=28, horizon_days=30
    )
    run = forecast_refresh(now=TODAY + STALE_AFTER + timedelta(seconds=1))
    stale.refresh_from_db()
    assert stale.state == ForecastRunState.FAILED and "lost" in stale.error
    assert run is not None and run.state == ForecastRunState.DONE


def test_a_failing_forecaster_fails_the_run_and_stores_nothing(org) -> None:
    job_at(org.proj_alpha, created=day(-3), finished=day(-1), flavors=[H100])

    def broken(history, horizon):
        raise ValueError("the fit diverged")

    with pytest.raises(ValueError):
        forecast_refresh(now=TODAY, forecaster=broken)
    run = ForecastRun.objects.get()
    assert run.state == ForecastRunState.FAILED and run.error == "the fit diverged"
    assert not PoolForecast.objects.exists()


def test_only_the_last_runs_are_kept(org) -> None:
    job_at(org.proj_alpha, created=day(-3), finished=day(-1), flavors=[H100])
    runs = [forecast_refresh(now=TODAY + timedelta(hours=h)) for h in range(7)]
    kept = list(ForecastRun.objects.values_list("id", flat=True))
    assert kept == [r.pk for r in reversed(runs)][:5]


def test_the_command_refreshes_now_and_says_so_when_one_runs(org) -> None:
    job_at(org.proj_alpha, created=day(-3), finished=day(-1), flavors=[H100])
    out = io.StringIO()
    call_command("capacity_refresh", stdout=out)
    run = ForecastRun.objects.get()
    assert out.getvalue().startswith(f"forecast run {run.pk}: 4 series")  # pool and 3 subtrees
    ForecastRun.objects.create(
        started_at=timezone.now(), last_day=day(-1).date(), history_days=28, horizon_days=30
    )
    with pytest.raises(CommandError, match="another refresh is running"):
        call_command("capacity_refresh", stdout=io.StringIO())
