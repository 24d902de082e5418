"""Job events in the notification outbox (issue 20): the daemon's apply path writes exactly one
row per notable event (started, finished, failed, preempted) in the transaction of the
transition, and calls no webhook while it cycles."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from scheduler.jobs.notifications import job_events_notify, job_link
from scheduler.models import Job
from tenants import outbox
from tenants.models import Notification, NotificationChannel, Tenant
from tests.daemon.conftest import Env, low_priority_cluster


@pytest.fixture
def hooked(env: Env, monkeypatch: pytest.MonkeyPatch) -> Env:
    Tenant.objects.filter(pk=env.org.alpha.pk).update(webhook_url="https://hooks.example.com/a")

    def never(url: str, body: bytes, headers: Any = None) -> None:
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
    low, daemon = low_priority_cluster(env)
    env.submit(resources={"gpus": 8}, priority_class="critical", simulation={"duration_s": 60})
    env.run(daemon)
    env.run(daemon, seconds=3, cycles=2)
    kinds = {j.pk: sent(j) for j in low}
    victims = [pk for pk, k in kinds.items() if "preempted" in k]
    assert len(victims) == 1
    assert kinds[victims[0]] == ["started", "preempted"]
    assert all(k == ["started"] for pk, k in kinds.items() if pk != victims[0])


def test_the_job_link_is_the_job_pages_url_for_any_id(env: Env, settings: Any) -> None:
    """The page's URL is reversed once and the id put in (`job_link`): it must be what
    `reverse` gives for every id."""
    settings.GANTRY_BASE_URL = "https://gantry.example.com/"
    for job_id in (1, 42, 987_654_321, 10**12):
        expected = "https://gantry.example.com" + reverse("portal:job-detail", args=[job_id])
        assert job_link(job_id) == expected


def test_events_nobody_receives_cost_one_query(env: Env, settings: Any) -> None:
    """No webhook anywhere and a kind that is not mailed: one query (is there a webhook?),
    no job read, no outbox row; a mailed kind reads only the jobs whose owner has an
    address."""
    settings.GANTRY_NOTIFY_EMAIL_EVENTS = frozenset({"finished"})
    job = env.submit(simulation={"duration_s": 60})
    with CaptureQueriesContext(connection) as started:
        assert job_events_notify([(job.pk, "state", "binding", "running", "")]) == 0
    assert len(started.captured_queries) == 1
    type(job.submitted_by).objects.filter(pk=job.submitted_by_id).update(email="")
    with CaptureQueriesContext(connection) as finished:
        assert job_events_notify([(job.pk, "state", "running", "succeeded", "")]) == 0
    assert len(finished.captured_queries) == 2  # the webhook check and the jobs with an address
    assert not Notification.objects.exists()


def test_preemptions_of_the_same_job_are_one_message_with_a_count(
    hooked: Env, settings: Any
) -> None:
    # Issue 35: a livelock preempted a job 21 times in 44 s and its owner got 21 emails. A
    # preempted notification is held GANTRY_NOTIFY_COALESCE_S; more preemptions of the job
    # meanwhile join it.
    settings.GANTRY_NOTIFY_COALESCE_S = 60.0
    job = hooked.submit()
    other = hooked.submit()
    row = (job.pk, "preempted", "running", "preempted", "Preempted: team-alpha reclaims.")
    for _ in range(3):
        job_events_notify([row])
    job_events_notify([(other.pk, "preempted", "running", "preempted", "")])
    webhook = Notification.objects.filter(payload__gantry__job=job.pk)
    assert sorted(webhook.values_list("channel", flat=True)) == ["email", "webhook"]
    for n in webhook:
        assert n.payload["gantry"]["count"] == 3
        assert "was preempted 3 times" in n.payload["text"]
        assert n.subject == f"[Gantry] job {job.name} was preempted 3 times"
    assert Notification.objects.filter(payload__gantry__job=other.pk).count() == 2
    # Held: not due before the window ends, then delivered as one message each.
    now = timezone.now()
    assert outbox.outbox_claim(now=now)[1] == []
    # Once it has been tried, a new preemption is a new message.
    Notification.objects.filter(payload__gantry__job=job.pk).update(attempts=1)
    job_events_notify([row])
    assert Notification.objects.filter(payload__gantry__job=job.pk).count() == 4
