"""Issue 35, item 5, in the browser: a lender whose borrower is inside its minimum runtime
reads the planned reclaim and when, not a bare quota line; the job's history keeps that
reason once and then the preemption it caused, another team's name hidden throughout; the
job preempted says, once requeued, where it stands. The
daemon runs in the test on the simulated cluster, against the test's database (SQLite in the
embedded default's pass)."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from scheduler.models import JobEvent
from tests.daemon.conftest import make_env
from tests.daemon.test_history import lender_waits
from tests.portal.browser.conftest import shoot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_lender_reads_the_planned_reclaim_and_the_history_keeps_it(page_for: Any) -> None:
    env = make_env()
    daemon, borrowed, _, lender = lender_waits(env)
    alice = page_for("alice")
    alice.goto(f"/jobs/{lender.pk}/")

    reason = alice.locator("#job-reason")
    expect(reason).to_contain_text(
        "team-alpha reclaims its guarantee from another team (8 H100-80GB lent): "
        "preemption planned in about 5 min, when its job leaves its minimum runtime"
    )
    history = alice.locator("ol.timeline")
    expect(history.locator("li", has_text="waiting")).to_have_count(1)
    expect(history).to_contain_text("reclaims its guarantee from another team")
    expect(alice.locator("#job-status")).not_to_contain_text("team-bravo")
    shoot(alice, "job-planned-reclaim")

    # Past the borrowers' minimum runtime: the reclaim happens; the page follows by itself.
    env.run(daemon, seconds=30, cycles=12)
    env.run(daemon, seconds=2, cycles=6)
    [victim] = [j for j in borrowed if JobEvent.objects.filter(job=j, kind="preempted").exists()]
    expect(alice.locator("#job-state")).to_have_text("Running", timeout=20_000)
    expect(history).to_contain_text(
        "Preempted a job of another team: team-alpha reclaims its guarantee from another team"
    )
    expect(history.locator("li", has_text="waiting")).to_have_count(2)  # planned, then stopping
    expect(alice.locator("#job-status")).not_to_contain_text("team-bravo")
    expect(alice.locator(f'a[href="/jobs/{victim.pk}/"]')).to_have_count(0)
    shoot(alice, "job-reclaimed-history")


def test_the_preempted_job_says_where_it_stands_once_requeued(page_for: Any) -> None:
    env = make_env()
    daemon, borrowed, _, _ = lender_waits(env)
    env.run(daemon, seconds=30, cycles=12)
    env.run(daemon, seconds=2, cycles=6)
    [victim] = [j for j in borrowed if JobEvent.objects.filter(job=j, kind="preempted").exists()]
    bob = page_for("bob-bravo")
    bob.goto(f"/jobs/{victim.pk}/")
    history = bob.locator("ol.timeline")
    expect(history).to_contain_text(
        "Back in the queue after preemption (another team reclaims its guarantee from "
        "team-bravo, which borrows): its place counts from its requeue, so 1 job of its team "
        "and class submitted after it stands ahead of it."
    )
    expect(bob.locator("#job-status")).not_to_contain_text("team-alpha")
    shoot(bob, "job-requeued-standing")
