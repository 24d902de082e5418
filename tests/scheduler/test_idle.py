"""Idle GPUs (issue 20): a job idle under its tenant's threshold for the rule's duration is
acted on once per episode (email; interactive jobs stopped when the rule says so); a busy
sample resets it. Time is the samples' and the scan's `now`: nothing waits."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core import mail

from scheduler import tasks
from scheduler.models import GpuDevice, Job, JobEvent, JobIdle, JobState, UtilizationSample
from scheduler.telemetry.idle import SCAN_LAG, idle_scan, tenant_idle_seconds
from scheduler.telemetry.idle_mail import idle_notification_send
from scheduler.telemetry.samples import holders_of
from tenants.models import IdleAction, IdleRule
from tests.billing.builders import T0, hold, job_for, make_node
from tests.conftest import Org

pytestmark = pytest.mark.django_db
STEP = timedelta(seconds=30)


def minutes(m: float) -> datetime:
    return T0 + timedelta(minutes=m)


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """The idle emails queued (the broker is not there in tests)."""
    calls: list[tuple[int, str]] = []
    monkeypatch.setattr(tasks.idle_notify, "delay", lambda *args: calls.append(args))
    return calls


class Cluster:
    def __init__(self, org: Org) -> None:
        self.org = org
        self.node = make_node("n1", gpus=4)
        self.devices = list(GpuDevice.objects.filter(node=self.node).order_by("index"))
        self.next_device = 0

    def job(self, job_type: str = "interactive", gpus: int = 1) -> tuple[Job, list[int]]:
        job = job_for(self.org, job_type=job_type, state=JobState.RUNNING)
        hold(job, self.node, 0, None, [1000] * gpus, first_device=self.next_device)
        ids = [d.id for d in self.devices[self.next_device : self.next_device + gpus]]
        self.next_device += gpus
        return job, ids

    def feed(self, devices: list[int], start: float, end: float, util: float) -> None:
        """A sample of each device every 30 s from minute `start` up to `end` (excluded),
        attributed as ingest attributes them (to the holders now), in one insert."""
        holders = holders_of(devices)
        rows, at = [], minutes(start)
        while at < minutes(end):
            rows += [
                UtilizationSample(
                    at=at,
                    device_id=d,
                    utilization_pct=util,
                    job_id=holders[d].job_id,
                    tenant_id=holders[d].tenant_id,
                    project_id=holders[d].project_id,
                    share_milli=holders[d].share_milli,
                )
                for d in devices
            ]
            at += STEP
        UtilizationSample.objects.bulk_create(rows)


def scan(at_minute: float, capture: Any) -> list[tuple[int, datetime]]:
    """A scan that sees every sample before minute `at_minute` (it leaves the last SCAN_LAG)."""
    with capture(execute=True):
        result = idle_scan(now=minutes(at_minute) + SCAN_LAG)
    return result.acted


def test_idle_after_30_minutes_under_5_percent_reset_by_a_busy_sample_notified_once(
    org: Org, queued: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    cluster = Cluster(org)
    job, devices = cluster.job("training")
    cluster.feed(devices, 0, 30, 2.0)  # samples at 0:00 .. 29:30
    assert scan(30, django_capture_on_commit_callbacks) == []
    state = JobIdle.objects.get(job=job)
    assert (state.idle_since, state.idle_seconds) == (minutes(0), 29.5 * 60)
    cluster.feed(devices, 30, 30.5, 2.0)  # 30:00: 30 minutes under 5 %
    assert scan(30.5, django_capture_on_commit_callbacks) == [(job.id, minutes(0))]
    assert queued == [(job.id, minutes(0).isoformat())]
    cluster.feed(devices, 30.5, 36, 1.0)  # still idle: no second action
    assert scan(36, django_capture_on_commit_callbacks) == []
    cluster.feed(devices, 36, 36.5, 50.0)  # busy: the episode ends
    scan(36.5, django_capture_on_commit_callbacks)
    state.refresh_from_db()
    assert (state.idle_since, state.idle_seconds) == (None, 0.0)
    # Idle time seen so far: from 0:00 to 35:30 (the last idle sample), 71 intervals of 30 s.
    assert state.idle_seconds_total == 35.5 * 60
    cluster.feed(devices, 36.5, 66.5, 3.0)  # a new episode: 36:30 .. 66:00 is 29.5 minutes
    assert scan(66.5, django_capture_on_commit_callbacks) == []
    cluster.feed(devices, 66.5, 67, 3.0)
    assert scan(67, django_capture_on_commit_callbacks) == [(job.id, minutes(36.5))]
    assert len(queued) == 2
    job.refresh_from_db()
    assert job.state == JobState.RUNNING  # notify only: the default action


def test_one_busy_device_keeps_a_job_busy(
    org: Org, queued: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    cluster = Cluster(org)
    job, (first, second) = cluster.job("training", gpus=2)
    cluster.feed([first], 0, 40, 0.0)
    cluster.feed([second], 0, 40, 80.0)
    assert scan(40, django_capture_on_commit_callbacks) == []
    assert JobIdle.objects.get(job=job).idle_since is None


def test_the_email_goes_to_the_owner_and_the_admins_above_once_per_episode(
    org: Org, queued: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    cluster = Cluster(org)
    _, devices = cluster.job("training")
    cluster.feed(devices, 0, 31, 0.0)
    scan(31, django_capture_on_commit_callbacks)
    [(job_id, episode)] = queued
    assert idle_notification_send(job_id, datetime.fromisoformat(episode)) is True
    assert idle_notification_send(job_id, datetime.fromisoformat(episode)) is False  # redelivered
    [message] = mail.outbox
    # alice submitted it; tina is admin of team-alpha, dana of research above it.
    assert message.to == ["alice@example.com", "dana@example.com", "tina@example.com"]
    assert "idle" in message.subject
    assert "under 5 % utilization" in message.body


def test_a_one_minute_rule_says_1_minute_in_the_email_and_the_event(
    org: Org, queued: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    """Issue 35: "(1 minutes or more)" and "for 1 minutes"."""
    IdleRule.objects.create(
        tenant=org.alpha, threshold_pct=5, duration_s=60, action=IdleAction.NOTIFY_AND_STOP
    )
    cluster = Cluster(org)
    notebook, devices = cluster.job("interactive")
    cluster.feed(devices, 0, 1.5, 0.0)
    scan(1.5, django_capture_on_commit_callbacks)
    [(job_id, episode)] = queued
    assert idle_notification_send(job_id, datetime.fromisoformat(episode)) is True
    [message] = mail.outbox
    assert "(1 minute or more)" in message.body, message.body
    event = JobEvent.objects.get(job=notebook, kind="idle_stopped")
    assert "utilization for 1 minute (the idle rule" in event.message, event.message


def test_notify_and_stop_stops_interactive_jobs_only(
    org: Org, queued: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    IdleRule.objects.create(
        tenant=org.research, threshold_pct=10, duration_s=600, action=IdleAction.NOTIFY_AND_STOP
    )
    cluster = Cluster(org)
    notebook, notebook_devices = cluster.job("interactive")
    training, training_devices = cluster.job("training")
    cluster.feed(notebook_devices + training_devices, 0, 10.5, 8.0)  # under research's 10 %
    acted = scan(10.5, django_capture_on_commit_callbacks)
    assert sorted(acted) == sorted([(notebook.id, minutes(0)), (training.id, minutes(0))])
    assert len(queued) == 2  # both notified
    notebook.refresh_from_db()
    training.refresh_from_db()
    assert (notebook.state, training.state) == (JobState.CANCELLED, JobState.RUNNING)
    event = JobEvent.objects.get(job=notebook, kind="idle_stopped")
    assert event.to_state == JobState.CANCELLED
    assert "under 10 % utilization for 10 minutes" in event.message


def test_action_nothing_keeps_the_idle_time_and_does_nothing(
    org: Org, queued: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    IdleRule.objects.create(tenant=org.alpha, action=IdleAction.NOTHING)
    cluster = Cluster(org)
    job, devices = cluster.job("interactive")
    cluster.feed(devices, 0, 40, 0.0)
    assert scan(40, django_capture_on_commit_callbacks) == []
    assert queued == []
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert tenant_idle_seconds(org.research) == {"current": 39.5 * 60, "total": 39.5 * 60}


def test_two_scans_count_each_sample_once(
    org: Org, queued: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    cluster = Cluster(org)
    job, devices = cluster.job("training")
    cluster.feed(devices, 0, 10, 0.0)
    scan(10, django_capture_on_commit_callbacks)
    scan(10, django_capture_on_commit_callbacks)  # again at the same time: nothing new
    assert JobIdle.objects.get(job=job).idle_seconds_total == 9.5 * 60
