"""Job events in the notification outbox (issue 20): the daemon's apply path writes exactly one
row per notable event (started, finished, failed, preempted, requeued after a lost node) in
the transaction of the transition, and calls no webhook while it cycles. What they say of
other teams is what the job's team may read (issue 35)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from scheduler.jobs.notifications import job_events_notify, job_link
from scheduler.models import Allocation, Job
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


def texts(job: Job) -> dict[str, str]:
    """The job's outbox rows by channel: the webhook's text, the email's subject and body."""
    rows = Notification.objects.filter(payload__gantry__job=job.pk).order_by("id")
    return {n.channel: f"{n.subject}\n{n.payload['text']}" for n in rows}


def test_a_job_that_loses_its_node_tells_its_owner_it_was_requeued(hooked: Env) -> None:
    """Issue 35: a node failure requeued jobs silently; their owners learnt of it from the
    attempt counter. The owner is mailed and the tenant's webhook told which node, and
    which retry the job waits for."""
    env = hooked
    job = env.submit(simulation={"duration_s": 10_000})
    daemon = env.daemon()
    env.run(daemon, seconds=2, cycles=2)
    node = Allocation.objects.get(job=job, ended_at__isnull=True).node.name
    env.backend.fail_node(node)
    env.run(daemon)
    job.refresh_from_db()
    assert job.attempt == 1
    assert sent(job) == ["started", "requeued"]
    assert sent(job, NotificationChannel.EMAIL) == ["requeued"]
    said = (
        f"Job {job.name} (#{job.pk}) in 'team-alpha' lost its node and was requeued: node "
        f"{node} is NotReady or gone; back in the queue for retry 1 of 9."
    )
    for text in texts(job).values():
        assert said in text, text
    email = Notification.objects.get(payload__gantry__job=job.pk, channel="email")
    assert email.recipient == "alice@example.com"
    assert email.subject == f"[Gantry] job {job.name} lost its node and was requeued"


# engine's message (`cycle._why`), what alpha's members may read of it; `{bravo}`/`{alpha}`:
# a job of team-bravo / team-alpha
PREEMPTION_MESSAGES = [
    (
        "Preempted: team-bravo reclaims its guarantee from team-alpha, which borrows.",
        "another team reclaims its guarantee from team-alpha, which borrows.",
    ),
    (
        "Preempted: best-effort job gives way to job {bravo}.",
        "best-effort job gives way to a job of another team.",
    ),
    (
        "Preempted: job {bravo} of higher priority in team-bravo.",
        "a job of another team of higher priority in another team.",
    ),
    (
        "Preempted: job {alpha} of higher priority in team-alpha.",
        "job {alpha} of higher priority in team-alpha.",
    ),
    (
        "Stopped: node h100-1 is being drained (drained).",
        "node h100-1 is being drained (drained).",
    ),
]


@pytest.mark.parametrize(
    ("message", "shown"),
    PREEMPTION_MESSAGES,
    ids=["reclaim-by-another-team", "preemptor-of-another-team", "priority-names-both",
         "preemptor-of-the-same-team", "drain"],
)  # fmt: skip
def test_the_preemption_notification_names_only_what_the_owners_team_may_see(
    hooked: Env, message: str, shown: str
) -> None:
    """Issue 35: the preemption email named the other team and its job to the victim's
    owner, which the portal hides ("a job of another team"); and it said "was preempted:
    Preempted: ..."."""
    env = hooked
    job, mine, theirs = env.submit(), env.submit(), env.submit("bob-bravo")
    ids = {"alpha": mine.pk, "bravo": theirs.pk}
    job_events_notify([(job.pk, "preempted", "running", "preempted", message.format(**ids))])
    said = f"Job {job.name} (#{job.pk}) in 'team-alpha' was preempted: {shown.format(**ids)}"
    for channel, text in texts(job).items():
        assert said in text, (channel, text)
        assert "team-bravo" not in text and f"job {theirs.pk}" not in text
        assert "Preempted:" not in text and "Stopped:" not in text


@pytest.mark.parametrize(
    ("to_state", "message", "said"),
    [
        ("running", "Running: all pods started.", "started: all pods started."),
        ("succeeded", "Succeeded.", "finished."),
        ("failed", "Failed: OOMKilled: a container ran out of memory.",
         "failed: OOMKilled: a container ran out of memory."),
    ],
    ids=["started", "finished", "failed"],
)  # fmt: skip
def test_a_notification_does_not_repeat_the_state_its_verb_says(
    hooked: Env, to_state: str, message: str, said: str
) -> None:
    job = hooked.submit()
    job_events_notify([(job.pk, "state", "binding", to_state, message)])
    text = Notification.objects.get(payload__gantry__job=job.pk, channel="webhook").payload["text"]
    assert f"in 'team-alpha' {said} http" in text, text
