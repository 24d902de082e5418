"""Rated lines kept under a key of their inputs (billing/statements/line_memo.py, issue 21's load).

The cluster of tests/billing/test_statements.py, metered for hours 0-3. Each test changes
one input the rating reads and checks that the next read gives the lines a fresh rating
gives, and that the change did change them (so the check could fail)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection

from billing.costs import lines as costs
from billing.costs.lines import CostLine, organisation_costs
from billing.metering.hourly import meter_usage
from billing.models import IdlePolicy, RateCard
from billing.policies import billing_policy_set
from billing.statements import line_memo
from billing.statements.guards import lifted
from scheduler.models import JobEvent, JobState
from scheduler.telemetry.rollups import LAG, rollup_run
from tests.billing.builders import T0, at, hold, job_for
from tests.billing.test_idle_usage import alice_job, feed
from tests.billing.test_statements import cluster
from tests.conftest import Org
from tests.factories import priority


def read(org: Org) -> Counter[CostLine]:
    """The cost lines of hours 0-4 as the cost routes read them: through the memo."""
    return Counter(organisation_costs(org.acme, T0, at(4)))


def rated_afresh(org: Org) -> Counter[CostLine]:
    """The same lines rated now, with nothing kept."""
    cache.clear()
    line_memo.forget_built()
    return read(org)


def test_a_second_read_rates_nothing(org: Org, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster(org)
    first = read(org)
    assert first and sum(line.amount for line in first.elements()) > 0

    def no_rating(*_: Any, **__: Any) -> Any:
        raise AssertionError("rated again")

    monkeypatch.setattr(costs, "organisation_lines", no_rating)
    assert read(org) == first
    line_memo.forget_built()  # another process of the web server: from the shared cache
    assert read(org) == first


def test_without_a_metered_hour_nothing_is_kept(org: Org) -> None:
    assert line_memo.inputs_key(org.acme, T0, at(4)) is None
    cluster(org)
    assert line_memo.inputs_key(org.acme, T0 + timedelta(days=1), at(48)) is None
    assert line_memo.inputs_key(org.acme, T0, at(4)) is not None


def _preempt_alice(org: Org) -> None:
    """Alice's attempt (hours 0-3, no ending yet: used) ends preempted: every metered hour of
    it is reclassified."""
    event = JobEvent.objects.create(
        job=alice_job(org), kind="state", from_state=JobState.RUNNING, to_state=JobState.PREEMPTED
    )
    JobEvent.objects.filter(pk=event.pk).update(at=at(3))


def _new_price(org: Org) -> None:
    """The database refuses to change a version that priced metered hours
    (billing/statements/guards.py); with its triggers lifted (a superuser's session), the key still
    follows the change."""
    with lifted(connection):
        RateCard.objects.filter(valid_from=at(2)).update(gpu_hour=Decimal("5.00"))


def _multiplier(org: Org) -> None:
    """A multiplier for the class alice's job runs at, on the card in force from hour 2
    (triggers lifted, as in `_new_price`)."""
    job = alice_job(org)
    card = RateCard.objects.get(valid_from=at(2))
    with lifted(connection):
        card.multipliers.create(priority_class=job.priority_class, multiplier=Decimal("2"))


def _spread_idle(org: Org) -> None:
    billing_policy_set(user=org.users["pat"], organisation=org.acme, idle_policy=IdlePolicy.SPREAD)


def _idle_samples(org: Org) -> None:
    """An hour's allocated-but-idle roll-up of alice's job: an allocated-idle line."""
    feed(alice_job(org), 0, 30, 2.0)
    while rollup_run(now=at(4) + LAG):
        pass


def _a_later_hour_metered(org: Org) -> None:
    """A job held a GPU in hour 4, metered later: its hour joins the window's lines."""
    node = alice_job(org).allocations.get().node
    hold(job_for(org, "bob-bravo", project=org.proj_bravo), node, 4, 4.5, [1000], first_device=3)
    assert meter_usage(now=at(6)) == 1


CHANGES: dict[str, Callable[[Org], None]] = {
    "an ending event reclassifies an attempt": _preempt_alice,
    "a rate card's price": _new_price,
    "a priority multiplier": _multiplier,
    "the idle capacity policy": _spread_idle,
    "utilization roll-ups": _idle_samples,
    "a new metered hour": _a_later_hour_metered,
}


@pytest.mark.parametrize("change", list(CHANGES), ids=list(CHANGES))
def test_each_input_changed_is_rated_again(org: Org, change: str) -> None:
    cluster(org)
    window_end = at(5) if change == "a new metered hour" else at(4)
    before = Counter(organisation_costs(org.acme, T0, window_end))
    CHANGES[change](org)
    after = Counter(organisation_costs(org.acme, T0, window_end))
    cache.clear()
    line_memo.forget_built()
    afresh = Counter(organisation_costs(org.acme, T0, window_end))
    assert afresh != before, "the change must change the lines, or this test checks nothing"
    assert after == afresh


def test_a_job_between_two_meterings_keeps_the_key(org: Org) -> None:
    """A job that starts and ends after the last metered hour cannot reclassify metered
    usage: a busy queue does not empty the memo."""
    cluster(org)
    key = line_memo.inputs_key(org.acme, T0, at(24))
    job = job_for(org, "bob-bravo", project=org.proj_bravo)
    hold(job, alice_job(org).allocations.get().node, 4.2, 4.6, [1000], first_device=3)
    for to_state in (JobState.FAILED, JobState.SUCCEEDED):
        JobEvent.objects.create(
            job=job, kind="state", from_state=JobState.RUNNING, to_state=to_state
        )
    assert line_memo.inputs_key(org.acme, T0, at(24)) == key
    # An ending of a job that held a GPU in a metered hour does change it.
    _preempt_alice(org)
    assert line_memo.inputs_key(org.acme, T0, at(24)) != key


def test_an_attempt_that_succeeds_keeps_the_key_and_its_lines(org: Org) -> None:
    """Alice's attempt held a GPU in every metered hour and has not ended: its usage is used.
    Succeeding, it stays used: the key and the lines stay, as a fresh rating says."""
    cluster(org)
    key = line_memo.inputs_key(org.acme, T0, at(4))
    lines = read(org)
    event = JobEvent.objects.create(
        job=alice_job(org), kind="state", from_state=JobState.RUNNING, to_state=JobState.SUCCEEDED
    )
    JobEvent.objects.filter(pk=event.pk).update(at=at(3))
    assert line_memo.inputs_key(org.acme, T0, at(4)) == key
    assert read(org) == lines == rated_afresh(org)


def test_each_process_keeps_a_bounded_number_of_windows(org: Org) -> None:
    cluster(org)
    for hours in range(1, line_memo.BUILT_KEPT + 5):
        organisation_costs(org.acme, T0, at(4) + timedelta(hours=hours))
    assert len(line_memo._built) == line_memo.BUILT_KEPT


def job_class(org: Org) -> str:
    return str(alice_job(org).priority_class.name)


def test_the_classes_multiplier_does_not_leak_across_priority_classes(org: Org) -> None:
    """The fingerprint carries each multiplier with its class: a multiplier for a class no
    job ran at changes the key but not the lines."""
    cluster(org)
    key = line_memo.inputs_key(org.acme, T0, at(4))
    lines = read(org)
    card = RateCard.objects.get(valid_from=at(2))
    other = next(name for name in ("low", "high", "urgent") if name != job_class(org))
    with lifted(connection):  # refused otherwise: the version priced metered hours
        card.multipliers.create(priority_class=priority(other), multiplier=Decimal("3"))
    assert line_memo.inputs_key(org.acme, T0, at(4)) != key
    assert read(org) == lines == rated_afresh(org)


def test_metering_rates_the_open_month_for_its_first_reader(
    org: Org, client_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster(org)  # hours 0-3 metered: the last one in January 2031
    assert costs.open_month_rated() == 1

    def no_rating(*_: Any, **__: Any) -> Any:
        raise AssertionError("rated again")

    monkeypatch.setattr(costs, "organisation_lines", no_rating)
    line_memo.forget_built()  # the web server's process: from the shared cache
    month = {"from": "2031-01-01T00:00:00Z", "to": "2031-02-01T00:00:00Z", "by": "team"}
    response = client_for("carol").get("/api/v1/costs/", month)
    assert response.status_code == 200, response.json()
    assert Decimal(response.json()["total"]["charged"]) > 0


def test_the_hourly_metering_task_rates_only_when_it_metered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from billing import tasks

    rated: list[bool] = []
    monkeypatch.setattr(tasks, "open_month_rated", lambda: rated.append(True) or 1)
    for metered in (0, 3):
        monkeypatch.setattr(tasks, "meter_usage", lambda now, metered=metered: metered)
        assert tasks.meter_closed_hours() == metered
    assert rated == [True]


def test_the_cluster_reconciliation_is_kept_until_an_hour_is_metered_or_a_price_changes(
    org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    from billing.statements import reconciliation as reconcile

    cluster(org)
    first = reconcile.cluster_reconciliation_kept(T0, at(6))
    assert first == reconcile.cluster_reconciliation(T0, at(6)) and first

    def no_splits(*_: Any, **__: Any) -> Any:
        raise AssertionError("split again")

    with monkeypatch.context() as patched:
        patched.setattr(reconcile, "cluster_splits", no_splits)
        line_memo.forget_built()  # another web process: from the shared cache
        assert reconcile.cluster_reconciliation_kept(T0, at(6)) == first

    for change in (_new_price, _a_later_hour_metered):
        before = reconcile.cluster_reconciliation_kept(T0, at(6))
        change(org)
        afresh = reconcile.cluster_reconciliation(T0, at(6))
        assert afresh != before, change.__name__
        assert reconcile.cluster_reconciliation_kept(T0, at(6)) == afresh, change.__name__
