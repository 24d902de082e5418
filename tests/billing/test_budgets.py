"""Budgets: spend from metering, reservations at admission, the policies at 100 %, alerts.

The month is February 2031 (the builders' T0 is 2031-01-31 20:00, so at(4) is 1 February
00:00). H100 costs 4.00 a GPU-hour (no CPU or memory price), A100 2.00.
"""

from __future__ import annotations

import importlib
import json
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.core import mail
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing import tasks
from billing.budgets import checks as admission
from billing.budgets.alerts import alert_email_send, alerts_check
from billing.budgets.checks import reservations_sweep
from billing.budgets.spend import budget_position
from billing.metering.hourly import meter_usage
from billing.models import (
    Budget,
    BudgetAlert,
    BudgetPolicy,
    BudgetReservation,
    BudgetSpend,
    BudgetUnit,
    RateMultiplier,
)
from billing.rates.cards import RatePrices, rate_card_add
from billing.rates.rating import round_cents
from billing.statements.rollup import usage_lines
from billing.tasks import budget_sweep
from scheduler.jobs.services import job_cancel, job_submit
from scheduler.jobs.transitions import Change, transition
from scheduler.models import Job, JobEvent, JobState
from tenants import outbox
from tenants import tasks as tenant_tasks
from tenants.approvals import approval_decide
from tenants.models import (
    ApprovalPolicy,
    ApprovalRequest,
    ApprovalRule,
    Notification,
    NotificationKind,
    NotificationState,
    Tenant,
)
from tests import factories as f
from tests.billing.builders import T0, at, hold, job_for, make_node
from tests.concurrency import run_in_threads
from tests.conftest import Org, job_spec

FEB = datetime(2031, 2, 1, tzinfo=UTC)


def rates(org: Org) -> None:
    start = T0 - timedelta(days=2)
    rate_card_add(
        user=org.users["pat"], flavor=org.h100, valid_from=start, prices=RatePrices(Decimal(4))
    )
    rate_card_add(
        user=org.users["pat"], flavor=org.a100, valid_from=start, prices=RatePrices(Decimal(2))
    )


def budget(tenant: Any, limit: str, **kw: Any) -> Budget:
    return Budget.objects.create(
        tenant=tenant, month=kw.pop("month", FEB), limit=Decimal(limit), **kw
    )


# --- spend ---------------------------------------------------------------------------------


def test_spend_is_what_the_subtree_was_metered_for_in_the_month_worked_out(org: Org) -> None:
    rates(org)
    budget(org.research, "100")
    budget(org.alpha, "40")
    budget(org.bravo, "3", unit=BudgetUnit.GPU_HOURS)
    node = make_node()
    # alpha: 2 GPUs from 31 Jan 22:00 to 1 Feb 02:00: 2 h in January, 2 h in February.
    hold(job_for(org), node, 2, 6, [1000, 1000])
    # bravo: half a GPU for 1 h 30 in February.
    hold(job_for(org, "bob-bravo", project=org.proj_bravo), node, 4, 5.5, [500], first_device=2)
    # charlie (another department): 1 GPU for 1 h; not research's.
    hold(job_for(org, "chris", project=org.proj_charlie), node, 4, 5, [1000], first_device=3)
    meter_usage(now=at(7))
    alpha = budget_position(org.alpha, at(6))
    assert alpha is not None
    # 2 GPUs x 2 h x 4.00 = 16.00; January's hours are January's.
    assert (alpha.spent, alpha.committed, alpha.remaining) == (
        Decimal("16.00"),
        0,
        Decimal("24.00"),
    )
    assert alpha.percent == Decimal("40.0") and alpha.month == FEB
    research = budget_position(org.research, at(6))
    assert research is not None
    # alpha 16.00 + bravo 0.5 GPU x 1.5 h x 4.00 = 3.00: 19.00 of 100.
    assert (research.spent, research.percent) == (Decimal("19.00"), Decimal("19.0"))
    bravo = budget_position(org.bravo, at(6))
    assert bravo is not None and bravo.unit == BudgetUnit.GPU_HOURS
    assert (bravo.spent, bravo.percent) == (Decimal("0.75"), Decimal("25.0"))  # 0.5 x 1.5 h
    assert budget_position(org.acme, at(6)) is None  # no budget
    assert budget_position(org.alpha, at(6) + timedelta(days=40)) is None  # March: none


def test_spend_is_what_the_statement_lines_charge_priced_the_same_way(org: Org) -> None:
    pat = org.users["pat"]
    rate_card_add(
        user=pat,
        flavor=org.h100,
        valid_from=T0 - timedelta(days=2),
        prices=RatePrices(
            Decimal("4.10"),
            Decimal("0.05"),
            Decimal("0.01"),
            borrowed_discount=Decimal("0.3"),
            multipliers={f.priority("high"): Decimal("1.5")},
        ),
    )
    # A rate change inside the month: from 1 Feb 05:00 the H100 costs 6.00.
    rate_card_add(user=pat, flavor=org.h100, valid_from=at(9), prices=RatePrices(Decimal(6)))
    budget(org.acme, "1000")
    node = make_node()
    dear = job_for(org, priority_class=f.priority("high"), cpu_milli=3000, memory_mib=5000)
    hold(dear, node, 4.2, 10.7, [750, 250])
    borrowed = job_for(
        org, "bob-bravo", project=org.proj_bravo, priority_class=f.priority("best-effort")
    )
    hold(borrowed, node, 3.5, 8.1, [1000], first_device=2)
    meter_usage(now=at(12))
    lines = usage_lines(org.acme, FEB, at(11))
    position = budget_position(org.acme, at(11))
    assert position is not None
    # The lines' exact amounts (before their rounding per line), to the cent.
    exact = sum((Fraction(line.rate) * line.exact for line in lines), Fraction(0))
    assert position.spent == round_cents(exact) > 0
    assert len({line.rate for line in lines}) >= 5  # multiplier, discount, CPU, memory, change


def test_spend_counts_an_hour_once_however_often_metering_runs(org: Org) -> None:
    rates(org)
    budget(org.alpha, "40")
    hold(job_for(org), make_node(), 4, 5, [1000])
    meter_usage(now=at(7))
    meter_usage(now=at(7))
    position = budget_position(org.alpha, at(6))
    assert position is not None and position.spent == Decimal("4.00")


class Killed(Exception):
    pass


@pytest.mark.parametrize("step", ["written", "finished"])
def test_a_metering_run_killed_mid_hour_leaves_spend_as_the_hours_metered(
    org: Org, step: str
) -> None:
    rates(org)
    budget(org.alpha, "40")
    hold(job_for(org), make_node(), 4, 6, [1000])  # 1 GPU, 1 Feb 00:00-02:00: 4.00 an hour
    seen: list[str] = []

    def kill_in_second_hour(name: str) -> None:
        seen.append(name)
        if name == step and seen.count(step) == 2:
            raise Killed(name)

    with pytest.raises(Killed):
        meter_usage(now=at(7), fault=kill_in_second_hour)
    first = budget_position(org.alpha, at(6))
    assert first is not None and first.spent == Decimal("4.00")  # the first hour alone
    meter_usage(now=at(7))
    again = budget_position(org.alpha, at(6))
    assert again is not None and again.spent == Decimal("8.00")


def test_metering_reads_the_rates_once_writes_spend_once_an_hour_and_checks_alerts_once(
    org: Org, sent: dict[str, list[Any]], django_capture_on_commit_callbacks: Any
) -> None:
    """The budgets hook used to read the rate cards again, update each tenant's spend row
    and queue an alert check, every hour of a run."""
    rates(org)
    budget(org.alpha, "40")
    node = make_node()
    hold(job_for(org), node, 4, 7, [1000])  # alpha: 1 GPU, 3 hours at 4.00
    hold(job_for(org, "bob-bravo", project=org.proj_bravo), node, 4, 7, [500], first_device=2)
    multipliers = RateMultiplier._meta.db_table
    spend = BudgetSpend._meta.db_table
    with (
        CaptureQueriesContext(connection) as queries,
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert meter_usage(now=at(8)) == 3
    sql = [q["sql"] for q in queries.captured_queries]
    assert len([q for q in sql if multipliers in q]) == 1  # the cards' prices, once a run
    writes = [q for q in sql if spend in q and q.startswith(("INSERT", "UPDATE"))]
    assert len(writes) == 3  # one upsert an hour for both tenants
    assert sent["checks"] == [sorted([org.alpha.pk, org.bravo.pk])]
    position = budget_position(org.alpha, at(6))
    assert position is not None and position.spent == Decimal("12.00")
    bravo = BudgetSpend.objects.get(tenant=org.bravo, month=FEB)
    assert (bravo.amount, bravo.gpu_hours) == (Decimal("6.000000"), Decimal("1.500000"))


def test_a_metering_run_killed_in_an_hour_still_checks_the_alerts_of_the_hours_it_committed(
    org: Org, sent: dict[str, list[Any]], django_capture_on_commit_callbacks: Any
) -> None:
    rates(org)
    budget(org.alpha, "6")  # the first hour (4.00) takes it to 66.7 %: the 50 % alert
    hold(job_for(org), make_node(), 4, 6, [1000])
    seen: list[str] = []

    def kill_in_second_hour(name: str) -> None:
        seen.append(name)
        if name == "written" and seen.count(name) == 2:
            raise Killed(name)

    with django_capture_on_commit_callbacks(execute=True), pytest.raises(Killed):
        meter_usage(now=at(7), fault=kill_in_second_hour)
    assert sent["checks"] == [[org.alpha.pk]]
    assert list(BudgetAlert.objects.values_list("threshold", flat=True)) == [50]


def test_a_rate_added_while_metering_runs_prices_the_hours_after_it(org: Org) -> None:
    rates(org)
    budget(org.alpha, "100")
    hold(job_for(org), make_node(), 4, 7, [1000])  # 1 GPU, 1 Feb 00:00-03:00
    added: list[str] = []

    def add_rate(name: str) -> None:
        # Inside the first hour's transaction, once it is metered: from 01:00, 6.00.
        if name == "finished" and not added:
            rate_card_add(
                user=org.users["pat"],
                flavor=org.h100,
                valid_from=at(5),
                prices=RatePrices(Decimal(6)),
            )
            added.append(name)

    meter_usage(now=at(8), fault=add_rate)
    position = budget_position(org.alpha, at(6))
    lines = usage_lines(org.acme, FEB, at(7))
    exact = sum((Fraction(line.rate) * line.exact for line in lines), Fraction(0))
    assert position is not None and position.spent == round_cents(exact) == Decimal("16.00")


# --- admission: reservations and the policies, through the real submit and approval ------

NOW = at(4 + 9 * 24 + 12)  # 2031-02-10 12:00 UTC
PER_HOUR = Decimal(32)  # the spec below: 2 replicas x 4 GPUs x 4.00


@pytest.fixture
def seeded_classes(transactional_db: Any) -> None:
    """Transactional tests truncate every table, the migration-seeded priority classes too."""
    seed = importlib.import_module("tenants.migrations.0002_seed_priority_classes").seed
    seed(django_apps, None)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "clock", lambda: NOW)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, settings: Any) -> dict[str, list[Any]]:
    """The tasks queued, run at once instead of through a broker (the outbox's delivery at
    NOW); webhooks posted to a fake transport that fails while `sent["down"]` is set."""
    # NOW is years after the wall clock that stamps the outbox's rows: keep the sent ones.
    settings.GANTRY_NOTIFY_RETENTION_DAYS = 100 * 365
    out: dict[str, list[Any]] = {"checks": [], "posts": [], "down": []}

    def check(tenant_ids: list[int], month: str) -> None:
        out["checks"].append(tenant_ids)
        alerts_check(tenant_ids, datetime.fromisoformat(month))

    def post(url: str, body: bytes, headers: Any = None) -> None:
        if out["down"]:
            raise OSError("connection refused")
        out["posts"].append((url, json.loads(body)))

    monkeypatch.setattr(tasks.budget_alerts_check, "delay", check)
    monkeypatch.setattr(tasks.budget_alert_email, "delay", alert_email_send)
    monkeypatch.setattr(tenant_tasks.notifications_deliver, "delay", lambda: deliver(NOW))
    monkeypatch.setattr(outbox, "webhook_transport", post)
    return out


def deliver(now: datetime) -> None:
    outbox.outbox_deliver(now=now)


def submit(org: Org, hours: float | None = 10, username: str = "alice", **kw: Any) -> Job:
    spec = job_spec(max_runtime_s=None if hours is None else int(hours * 3600), **kw)
    job, _ = job_submit(user=org.users[username], project=org.proj_alpha, payload=spec)
    return job


def committed(tenant: Any) -> Decimal:
    position = budget_position(tenant, NOW)
    assert position is not None
    return position.committed


def decide(org: Org, job: Job, approve: bool = True) -> None:
    request = ApprovalRequest.objects.get(kind="job", subject_id=job.pk)
    approval_decide(user=org.users["tina"], request=request, approve=approve, comment="")


def test_an_admitted_job_reserves_its_projected_cost_until_it_ends(org: Org, clock: None) -> None:
    rates(org)
    budget(org.alpha, "1000")
    job = submit(org, hours=10)
    assert job.state == JobState.QUEUED
    # 2 replicas x 4 GPUs x 4.00 x 10 h = 320.00 reserved.
    assert BudgetReservation.objects.get(job=job).amount == Decimal("320.00")
    assert committed(org.alpha) == Decimal("320.00")
    job_cancel(user=org.users["alice"], job=job)
    assert committed(org.alpha) == 0
    assert BudgetReservation.objects.get(job=job).released_at == NOW


def test_an_unbounded_job_reserves_to_the_month_end_at_the_dearest_price(
    org: Org, clock: None
) -> None:
    rates(org)
    budget(org.alpha, "100000")
    job = submit(org, hours=None, flavors=["H100-80GB", "A100-40GB"])
    # From 10 Feb 12:00 to 1 Mar: 18.5 days = 444 h, at H100's 32.00 an hour = 14,208.00.
    assert BudgetReservation.objects.get(job=job).amount == Decimal("14208.00")
    assert BudgetReservation.objects.get(job=job).gpu_hours == Decimal(8 * 444)


def test_metering_locks_an_hours_reservations_by_its_period_not_by_a_list_of_its_jobs(
    org: Org,
) -> None:
    """The hour's open reservations were looked up with one parameter per job of the hour (a
    query of hundreds of parameters to compose and send every hour of a busy cluster); the
    hour's records are written by then, so their period finds the jobs."""
    rates(org)
    node = make_node()
    for device in range(3):
        hold(job_for(org), node, 4, 5, [1000], first_device=device)
    reservations = BudgetReservation._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        assert meter_usage(now=at(6)) == 1
    locks = [q["sql"] for q in queries.captured_queries if f'FROM "{reservations}"' in q["sql"]]
    assert len(locks) == 1
    assert "billing_usagerecord" in locks[0] and " IN (SELECT" in locks[0]


def test_what_a_running_job_was_metered_for_moves_from_committed_to_spent(
    org: Org, clock: None
) -> None:
    rates(org)
    budget(org.alpha, "1000")
    job = submit(org, hours=10)
    # One replica held 4 GPUs for 2 hours: 8 GPU-hours x 4.00 = 32.00 metered.
    hold(job, make_node(), 4 + 9 * 24 + 12, 4 + 9 * 24 + 14, [1000] * 4)
    meter_usage(now=NOW + timedelta(hours=3))
    position = budget_position(org.alpha, NOW)
    assert position is not None
    assert (position.spent, position.committed) == (Decimal("32.00"), Decimal("288.00"))
    assert position.percent == Decimal("32.0")  # (32 + 288) / 1000


def test_a_job_failing_in_the_daemon_gives_its_reservation_back(org: Org, clock: None) -> None:
    rates(org)
    budget(org.alpha, "1000")
    job = submit(org, hours=10)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    done = transition(
        [Change(job.pk, (JobState.RUNNING,), JobState.FAILED, message="exit code 1")], NOW
    )
    assert job.pk in done.done
    assert committed(org.alpha) == 0
    assert BudgetReservation.objects.get(job=job).released_at is not None


def test_the_sweep_releases_the_reservation_of_a_job_final_without_its_hook(
    org: Org, clock: None
) -> None:
    rates(org)
    budget(org.alpha, "1000")
    job = submit(org, hours=10)
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)  # no hook ran
    assert committed(org.alpha) == 0  # a final job commits nothing, released or not
    assert reservations_sweep() == 1
    assert reservations_sweep() == 0
    assert BudgetReservation.objects.get(job=job).released_at == NOW


def test_notify_queues_the_job_that_takes_the_budget_over_and_alerts_once_per_threshold(
    org: Org, clock: None, sent: dict[str, list[Any]], django_capture_on_commit_callbacks: Any
) -> None:
    rates(org)
    budget(org.alpha, "1000", policy=BudgetPolicy.NOTIFY)
    Tenant.objects.filter(pk=org.alpha.pk).update(webhook_url="https://hooks.example.com/a")
    with django_capture_on_commit_callbacks(execute=True):
        first = submit(org, hours=10)  # 320: 32 %
    assert BudgetAlert.objects.count() == 0 and mail.outbox == []
    with django_capture_on_commit_callbacks(execute=True):
        second = submit(org, hours=10)  # 640: 64 %, the 50 % alert
    with django_capture_on_commit_callbacks(execute=True):
        third = submit(org, hours=15)  # 640 + 480 = 1120: 112 %, over, and queued
    assert [first.state, second.state, third.state] == [JobState.QUEUED] * 3
    assert sorted(BudgetAlert.objects.values_list("threshold", flat=True)) == [50, 80, 100]
    subjects = [m.subject for m in mail.outbox]
    assert len(subjects) == 3 and all(m.to == ["tina@example.com"] for m in mail.outbox)
    assert "reached 100 %" in subjects[-1]
    assert "at 112 % (crossed 100 %)" in mail.outbox[-1].body
    assert [p[0] for p in sent["posts"]] == ["https://hooks.example.com/a"] * 3
    assert "team-alpha's budget for 2031-02 is at 112" in sent["posts"][-1][1]["text"]
    with django_capture_on_commit_callbacks(execute=True):
        submit(org, hours=1)
    assert alerts_check([org.alpha.pk], FEB) == []
    assert len(mail.outbox) == 3 and len(sent["posts"]) == 3  # once each
    alerts = Notification.objects.filter(kind=NotificationKind.BUDGET_ALERT)
    assert [n.payload["gantry"]["threshold"] for n in alerts] == [50, 80, 100]


def test_a_failing_webhook_neither_stops_the_email_nor_posts_twice(
    org: Org, clock: None, sent: dict[str, list[Any]], django_capture_on_commit_callbacks: Any
) -> None:
    rates(org)
    budget(org.alpha, "100")
    Tenant.objects.filter(pk=org.alpha.pk).update(webhook_url="https://hooks.example.com/a")
    sent["down"].append(True)
    with django_capture_on_commit_callbacks(execute=True):
        submit(org, hours=10)  # 320 %: three alerts; their webhook posts fail
    assert len(mail.outbox) == 3 and sent["posts"] == []
    waiting = Notification.objects.filter(kind=NotificationKind.BUDGET_ALERT)
    assert [(n.state, n.attempts) for n in waiting] == [(NotificationState.PENDING, 1)] * 3
    assert waiting[0].last_error == outbox.FAILED_REASON  # the detail is in the log only
    sent["down"].clear()
    deliver(NOW)  # not due yet: the backoff holds them
    assert sent["posts"] == []
    deliver(NOW + outbox.backoff(1))  # the retry sends what is left, once
    budget_sweep()
    assert len(mail.outbox) == 3 and len(sent["posts"]) == 3
    deliver(NOW + outbox.backoff(1) * 2)
    budget_sweep()
    assert len(mail.outbox) == 3 and len(sent["posts"]) == 3


def test_approval_sends_the_job_through_the_approval_workflow_with_the_figures(
    org: Org, clock: None
) -> None:
    rates(org)
    budget(org.alpha, "1000", policy=BudgetPolicy.APPROVAL)
    first = submit(org, hours=25)  # 800
    assert first.state == JobState.QUEUED
    job = submit(org, hours=10)  # 800 + 320 = 1120
    assert job.state == JobState.PENDING_APPROVAL
    reason = "would take team-alpha's budget for 2031-02 to 112 % (EUR 1,120.00 of 1,000.00)"
    assert reason in job.reason
    request = ApprovalRequest.objects.get(kind="job", subject_id=job.pk)
    assert reason in request.reasons
    (figures,) = request.payload["budgets"]
    assert figures["tenant"] == "team-alpha"
    assert (figures["limit"], figures["spent"], figures["committed"]) == (
        "1000.00",
        "0.00",
        "1120.00",
    )
    assert request.payload["estimated_cost"]["high"] == "320.00"
    assert not BudgetReservation.objects.filter(job=job).exists()  # not admitted yet
    decide(org, job)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert BudgetReservation.objects.get(job=job).amount == Decimal("320.00")
    assert committed(org.alpha) == Decimal("1120.00")


def test_a_job_cancelled_while_pending_approval_never_reserves(org: Org, clock: None) -> None:
    rates(org)
    budget(org.alpha, "100", policy=BudgetPolicy.APPROVAL)
    job = submit(org, hours=10)
    assert job.state == JobState.PENDING_APPROVAL
    job_cancel(user=org.users["alice"], job=job)
    assert not BudgetReservation.objects.filter(job=job).exists()
    assert committed(org.alpha) == 0


def test_a_rejected_job_never_reserves(org: Org, clock: None) -> None:
    rates(org)
    budget(org.alpha, "100", policy=BudgetPolicy.APPROVAL)
    job = submit(org, hours=10)
    decide(org, job, approve=False)
    job.refresh_from_db()
    assert job.state == JobState.REJECTED
    assert not BudgetReservation.objects.filter(job=job).exists()


def test_best_effort_runs_the_job_at_the_best_effort_class_saying_why(
    org: Org, clock: None
) -> None:
    rates(org)
    budget(org.alpha, "100", policy=BudgetPolicy.BEST_EFFORT)
    job = submit(org, hours=10)
    assert (job.state, job.priority_class.name) == (JobState.QUEUED, "best-effort")
    reason = "would take team-alpha's budget for 2031-02 to 320 % (EUR 320.00 of 100.00)"
    assert reason in job.reason and job.spec["priority_class"] == "best-effort"
    event = JobEvent.objects.get(job=job, kind="priority_class")
    assert "runs at best-effort" in event.message and reason in event.message
    assert BudgetReservation.objects.filter(job=job).exists()


def test_a_budget_at_100_percent_already_applies_its_policy_to_a_free_job(
    org: Org, clock: None
) -> None:
    rates(org)
    budget(org.alpha, "100", policy=BudgetPolicy.APPROVAL)
    BudgetSpend.objects.create(tenant=org.alpha, month=FEB, amount=Decimal(100))
    # No GPU, and CPU has no price: it costs nothing.
    free = submit(org, hours=1, resources={"gpus": 0, "cpu_milli": 1000, "memory_mib": 1024})
    assert free.state == JobState.PENDING_APPROVAL


def test_an_ancestors_budget_applies_to_its_subtree(org: Org, clock: None) -> None:
    rates(org)
    budget(org.alpha, "10000")
    budget(org.research, "500", policy=BudgetPolicy.APPROVAL)
    assert submit(org, hours=10).state == JobState.QUEUED  # research: 320 of 500
    job = submit(org, hours=10)  # 640 of 500
    assert job.state == JobState.PENDING_APPROVAL
    assert "would take research's budget for 2031-02 to 128 %" in job.reason
    assert "team-alpha's budget" not in job.reason
    assert committed(org.research) == Decimal("320.00")


def test_a_gpu_hour_budget_counts_gpu_hours(org: Org, clock: None) -> None:
    rates(org)
    budget(org.alpha, "100", unit=BudgetUnit.GPU_HOURS, policy=BudgetPolicy.APPROVAL)
    assert submit(org, hours=10).state == JobState.QUEUED  # 8 GPUs x 10 h = 80 GPU-hours
    job = submit(org, hours=5)  # 80 + 40 = 120
    assert "to 120 % (120.00 GPU-hours of 100.00 GPU-hours)" in job.reason


# --- the cost-based approval rule ---------------------------------------------------------


@pytest.mark.parametrize(
    ("hours", "state", "reason"),
    [
        (3, JobState.QUEUED, None),  # 96.00, not over 100
        (10, JobState.PENDING_APPROVAL, "may cost up to EUR 320.00"),
        (None, JobState.PENDING_APPROVAL, "has no maximum runtime, so its cost is unbounded"),
    ],
    ids=["under", "over", "unbounded"],
)
def test_estimated_cost_over_n_sends_dearer_jobs_to_approval(
    org: Org, clock: None, hours: float | None, state: str, reason: str | None
) -> None:
    rates(org)
    ApprovalPolicy.objects.create(
        tenant=org.research, rule=ApprovalRule.COST_OVER, threshold=Decimal(100)
    )
    job = submit(org, hours=hours)
    assert job.state == state
    if reason is not None:
        assert reason in job.reason
        assert "(policy of 'research': estimated cost over EUR 100)" in job.reason
        request = ApprovalRequest.objects.get(kind="job", subject_id=job.pk)
        assert request.rules[0]["rule"] == "cost_over"


@pytest.mark.postgresql("row locks: SQLite serialises writers on its database lock")
def test_jobs_submitted_together_against_a_budget_are_judged_one_after_another(
    transactional_db: Any,
    seeded_classes: None,
    org: Org,
    clock: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Forced interleaving: job-a has read the budget's position and holds its transaction
    # open until job-b has read it too, or is seen blocked on a lock. Without the budget's
    # row lock job-b sees no reservation of job-a and is queued beside it: 1280 of 1000
    # without approval. With it, job-b waits for job-a's commit, sees 640 committed and
    # goes to approval.
    rates(org)
    budget(org.alpha, "1000", policy=BudgetPolicy.APPROVAL)
    a_read, b_entered, b_read = threading.Event(), threading.Event(), threading.Event()
    real_projection, real_breaches = admission.job_projection, admission.budget_breaches

    def b_blocked() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            return bool(cursor.fetchone()[0])

    def projection(job: Job, **kw: Any) -> Any:
        if job.name == "job-b":
            assert a_read.wait(10), "job-a never read the budget"
            b_entered.set()
        return real_projection(job, **kw)

    def breaches(job: Job, *args: Any, **kw: Any) -> Any:
        found = real_breaches(job, *args, **kw)
        if job.name == "job-b":
            b_read.set()
            return found
        a_read.set()
        assert b_entered.wait(10), "job-b never started"
        while not b_read.wait(0.01) and not b_blocked():
            pass
        return found

    monkeypatch.setattr(admission, "job_projection", projection)
    monkeypatch.setattr(admission, "budget_breaches", breaches)
    results = run_in_threads(
        lambda: submit(org, hours=20, name="job-a"), lambda: submit(org, hours=20, name="job-b")
    )
    assert [kind for kind, _ in results] == ["ok", "ok"], results
    states = {job.name: job.state for _, job in results}
    assert states == {"job-a": JobState.QUEUED, "job-b": JobState.PENDING_APPROVAL}
