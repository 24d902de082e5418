"""capacity.history: requested (the queue's waits included), allocated and used GPU-hours per
day, per pool and subtree, from jobs, allocations and roll-ups."""

from __future__ import annotations

from datetime import timedelta

import pytest

from capacity.history import Window, demand_history
from tests.capacity.builders import TODAY, day, job_at, ran, rollup

pytestmark = pytest.mark.django_db

H100, A100 = "H100-80GB", "A100-40GB"


def three_days() -> Window:
    return Window(first_day=(TODAY - timedelta(days=3)).date(), days=3, now=TODAY)


def test_requested_counts_the_wait_allocated_only_the_run_used_the_rollups(org) -> None:
    # team-alpha: 2 GPUs asked from day -3 12:00, running from 18:00, done day -2 12:00.
    job = job_at(org.proj_alpha, created=day(-3, 12), finished=day(-2, 12), gpus=2)
    ran(job, started=day(-3, 18), ended=day(-2, 12), flavor=H100)
    # team-bravo: 1 A100 asked on day -1 and still waiting "now" (TODAY 00:00).
    job_at(org.proj_bravo, created=day(-1), flavors=[A100])
    # team-alpha held H100s for 2 GPU-hours at 50% on day -2: 1 GPU-hour used.
    rollup(org.alpha, at=day(-2, 10), flavor=H100, gpu_seconds=7200, mean=50)

    got = demand_history(three_days())

    alpha = got[(H100, org.alpha.pk)]
    # requested: 12 h x 2 on day -3 (waiting 6 h included), 12 h x 2 on day -2.
    assert list(alpha["requested"]) == pytest.approx([24, 24, 0])
    # allocated: 6 h x 2 on day -3, 12 h x 2 on day -2.
    assert list(alpha["allocated"]) == pytest.approx([12, 24, 0])
    assert list(alpha["used"]) == pytest.approx([0, 1, 0])
    # The waiting A100 job: 24 GPU-hours asked on day -1, nothing allocated.
    bravo = got[(A100, org.bravo.pk)]
    assert list(bravo["requested"]) == pytest.approx([0, 0, 24])
    assert list(bravo["allocated"]) == pytest.approx([0, 0, 0])


def test_subtrees_and_the_whole_pool_add_their_teams(org) -> None:
    for project, gpus in ((org.proj_alpha, 1), (org.proj_bravo, 3), (org.proj_charlie, 4)):
        job_at(project, created=day(-3), finished=day(-2), gpus=gpus, flavors=[H100])

    got = demand_history(three_days())

    def first(key):
        return got[key]["requested"][0]

    assert first((H100, org.alpha.pk)) == pytest.approx(24)
    assert first((H100, org.research.pk)) == pytest.approx(24 * (1 + 3))
    assert first((H100, org.product.pk)) == pytest.approx(24 * 4)
    assert first((H100, org.acme.pk)) == pytest.approx(24 * 8)
    assert first((H100, None)) == pytest.approx(24 * 8)


def test_a_job_counts_in_the_pool_it_ran_on_not_the_first_it_allowed(org) -> None:
    job = job_at(org.proj_alpha, created=day(-3), finished=day(-2), flavors=[A100, H100])
    ran(job, started=day(-3), ended=day(-2), flavor=H100)

    got = demand_history(three_days())

    assert got[(H100, None)]["requested"][0] == pytest.approx(24)
    assert (A100, None) not in got


def test_jobs_outside_the_window_are_not_read(org) -> None:
    job_at(org.proj_alpha, created=day(-10), finished=day(-5))
    job_at(org.proj_alpha, created=day(0, 1))  # after the window's end
    assert demand_history(three_days()) == {}


def test_a_job_that_allows_any_model_is_its_own_line(org) -> None:
    job_at(org.proj_alpha, created=day(-3), finished=day(-2))
    assert demand_history(three_days())[("", None)]["requested"][0] == pytest.approx(24)


def test_the_history_reads_in_a_bounded_number_of_queries(org, django_assert_max_num_queries):
    for n in range(30):
        job = job_at(org.proj_alpha, created=day(-3), finished=day(-2), flavors=[H100])
        if n % 2:
            ran(job, started=day(-3, 1), ended=day(-2), flavor=H100)
    # renames, tenant paths, the jobs' allocations, jobs, allocations, roll-ups
    with django_assert_max_num_queries(6):
        got = demand_history(three_days())
    assert got[(H100, None)]["requested"][0] == pytest.approx(30 * 24)
