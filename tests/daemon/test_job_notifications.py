"""Job events in the notification outbox (issue 20): the daemon's apply path writes exactly one
row per notable event (started, finished, failed, preempted) in the transaction of the
transition, and calls no webhook while it cycles."""

from __future__ import annotations

import pytest

from scheduler.models import Job
from tenants import outbox
from tenants.models import Notification, NotificationChannel, Tenant
from tests.daemon.conftest import Env


@pytest.fixture
def hooked(env: Env, monkeypatch: pytest.MonkeyPatch) -> Env:
    Tenant.objects.filter(pk=env.org.alpha.pk).update(webhook_url="https://hooks.example.com/a")

    def never(url: str, body: bytes) -> None:
        raise AssertionError("the daemon called the webhook")

    monkeypatch.setattr(outbox, "webhook_transport", never)
    return env


def sent(job: Job, channel: str = NotificationChannel.WEBHOOK) -> list[str]:
    rows = Notification.objects.filter(channel=channel, payload__gantry__job=job.pk)
    return list(rows.order_by("id").values_list("kind", flat=True))


def test_a_job_that_runs_and_finishes_notifies_started_then_finished_once(hooked: Env) -> None:
    env = hooked
    job = env.submit(simulation={"duration_s": 60})
    daemon = env.daemon()
    env.run(daemon)
    env.run(daemon, seconds=2)
    assert Job.objects.get(pk=job.pk).state == "running"
    assert sent(job) == ["started"]
    env.run(daemon, seconds=60, cycles=3)
    assert Job.objects.get(pk=job.pk).state == "succeeded"
    assert sent(job) == ["started", "finished"]
    # The owner's email: finished by default (GANTRY_NOTIFY_EMAIL_EVENTS), not started.
    emails = Notification.objects.filter(channel=NotificationChannel.EMAIL)
    assert list(emails.values_list("kind", "recipient")) == [("finished", "alice@example.com")]
    row = Notification.objects.get(kind="finished", channel=NotificationChannel.WEBHOOK)
    assert row.tenant_id == env.org.alpha.pk
    assert f"(#{job.pk})" in row.payload["text"] and row.payload["gantry"]["name"] == job.name


def test_a_failed_job_notifies_failed_once(hooked: Env) -> None:
    env = hooked
    job = env.submit(simulation={"duration_s": 10, "fail": True}, retry={"limit": 0})
    daemon = env.daemon()
    env.run(daemon)
    env.run(daemon, seconds=2)
    assert Job.objects.get(pk=job.pk).state == "running"
    env.run(daemon, seconds=12, cycles=2)
    assert Job.objects.get(pk=job.pk).state == "failed"
    assert sent(job) == ["started", "failed"]


def test_a_preempted_job_notifies_preempted_once(hooked: Env) -> None:
    env = hooked
    low = [
        env.submit(resources={"gpus": 8}, priority_class="low", simulation={"duration_s": 10_000})
        for _ in range(4)
    ]
    daemon = env.daemon()
    daemon.profile = type(daemon.profile)(min_runtime_s=0)
    env.run(daemon, seconds=2, cycles=2)
    env.submit(resources={"gpus": 8}, priority_class="critical", simulation={"duration_s": 60})
    env.run(daemon)
    env.run(daemon, seconds=3, cycles=2)
    kinds = {j.pk: sent(j) for j in low}
    victims = [pk for pk, k in kinds.items() if "preempted" in k]
    assert len(victims) == 1
    assert kinds[victims[0]] == ["started", "preempted"]
    assert all(k == ["started"] for pk, k in kinds.items() if pk != victims[0])
