"""The job-event counters of /metrics as running totals past a watermark of event ids
(scheduler/metrics/tally.py): at every scrape they equal a count over the whole history
(scheduler/metrics/recount.py, what /metrics computed before), as events arrive between
scrapes, commit out of id order, or two scrapes run at once. The scrape's clock is injected.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler.metrics import tally as metrics_tally
from scheduler.metrics.recount import recount
from scheduler.metrics.tally import GRACE, MARK, job_event_tallies
from scheduler.models import EventTally, EventTallyMark, Job, JobEvent, JobState
from tests import factories as f
from tests.concurrency import rendezvous, run_in_threads
from tests.conftest import Org

S = JobState
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
CLASSES = ("normal", "high", "best-effort")


def new_job(org: Org, rng: random.Random) -> Job:
    project, user = rng.choice(
        [(org.proj_alpha, "alice"), (org.proj_bravo, "bob-bravo"), (org.proj_charlie, "chris")]
    )
    klass = f.priority(rng.choice(CLASSES))
    return f.JobFactory(project=project, submitted_by=org.users[user], priority_class=klass)


def lives(
    org: Org, rng: random.Random, jobs: int, start: datetime, span_s: float, quick: bool = False
) -> list[Any]:
    """The events of `jobs` new jobs from `start` on, in time order: each queued within
    `span_s / 2`, admitted after a wait of a second to hours (`quick`: seconds), and some
    preempted (by another job, or a drain) and requeued, up to three times."""
    waits = [0.4, 3, 9] if quick else [0.4, 3, 50, 700, 5000, 20000]
    runs = 10 if quick else 600
    made = [new_job(org, rng) for _ in range(jobs)]
    planned: list[tuple[datetime, Job, str, dict[str, Any]]] = []
    for job in made:
        at = start + timedelta(seconds=rng.uniform(0, span_s / 2))
        for attempt in range(rng.randint(1, 3)):
            planned.append(
                (at, job, S.QUEUED, {"kind": "submitted" if not attempt else "requeued"})
            )
            at += timedelta(seconds=rng.choice(waits) * rng.random())
            planned.append((at, job, S.ADMITTED, {"from_state": S.QUEUED}))
            if rng.random() < 0.5:
                break
            at += timedelta(seconds=rng.uniform(1, runs))
            by = rng.choice([*made, None])
            data = {"preemptor": str(by.pk)} if by is not None else {}
            planned.append((at, job, S.PREEMPTED, {"kind": "preempted", "data": data}))
    return sorted(planned, key=lambda p: (p[0], p[1].pk))


def write(planned: list[Any]) -> list[int]:
    """Insert in time order (ids rise with time, as in production); `at` as planned."""
    ids = []
    for at, job, to_state, fields in planned:
        made = JobEvent.objects.create(job=job, to_state=to_state, **fields)
        JobEvent.objects.filter(pk=made.pk).update(at=at)  # `at` is auto_now_add
        ids.append(made.pk)
    return ids


def mark() -> int:
    return EventTallyMark.objects.get(name=MARK).event_id


def assert_equal_to_a_recount(now: datetime) -> None:
    assert job_event_tallies(now=now).as_plain() == recount().as_plain()


@pytest.mark.django_db
def test_the_totals_equal_a_recount_at_every_scrape_as_events_arrive(org: Org) -> None:
    rng = random.Random(20)
    old = write(lives(org, rng, 40, NOW - timedelta(hours=30), 6 * 3600))
    assert_equal_to_a_recount(NOW)
    assert mark() == max(old)  # all of it settled: older than GRACE
    # Events between scrapes, some within GRACE of the scrape: served, not settled yet.
    recent = write(lives(org, rng, 15, NOW - GRACE / 2, 20, quick=True))
    assert_equal_to_a_recount(NOW)
    assert mark() == max(old)
    assert_equal_to_a_recount(NOW)  # a second scrape at the same time adds nothing twice
    later = NOW + 2 * GRACE
    assert_equal_to_a_recount(later)
    assert mark() == max(recent)
    # A requeue and a new admission of jobs whose first admission is already in the totals:
    # their waits count from the requeue, an event after the watermark.
    for job in Job.objects.order_by("pk")[:5]:
        write([(later, job, S.QUEUED, {"kind": "requeued"})])
        write([(later + timedelta(seconds=9), job, S.ADMITTED, {"from_state": S.QUEUED})])
    assert_equal_to_a_recount(later + timedelta(seconds=10))
    assert_equal_to_a_recount(later + 3 * GRACE)
    assert job_event_tallies(now=later + 3 * GRACE).as_plain()[0]  # not vacuous
    assert sum(EventTally.objects.filter(kind="preempted").values_list("n", flat=True)) == (
        JobEvent.objects.filter(kind="preempted").count()
    )


@pytest.mark.django_db
def test_an_event_committed_late_below_seen_ids_is_counted(org: Org) -> None:
    """A transaction took an id, another took the next one and committed first: the first's
    event appears later, below an id the scrape has seen. The watermark stopped at the last
    old event, below the straggler, so the next scrape counts it."""
    rng = random.Random(7)
    old = write(lives(org, rng, 10, NOW - timedelta(hours=30), 3600))
    job = new_job(org, rng)
    [queued] = write([(NOW - timedelta(hours=1), job, S.QUEUED, {"kind": "submitted"})])
    [straggler_id] = write([(NOW - timedelta(seconds=20), job, S.ADMITTED, {})])
    JobEvent.objects.filter(pk=straggler_id).delete()  # not committed yet: invisible
    write([(NOW - timedelta(seconds=10), new_job(org, rng), S.QUEUED, {"kind": "submitted"})])
    assert_equal_to_a_recount(NOW)
    # Old events up to `queued`, then the straggler's id, then a recent event: the watermark
    # stops at `queued`, not at the id before the recent event (the straggler's).
    assert mark() == queued > max(old)
    JobEvent.objects.create(id=straggler_id, job=job, to_state=S.ADMITTED, from_state=S.QUEUED)
    JobEvent.objects.filter(pk=straggler_id).update(at=NOW - timedelta(seconds=20))
    assert_equal_to_a_recount(NOW + timedelta(seconds=5))
    assert_equal_to_a_recount(NOW + 2 * GRACE)  # settled now, and still counted once
    assert mark() == JobEvent.objects.order_by("-id").values_list("id", flat=True)[0]


@pytest.mark.django_db(transaction=True)
def test_two_scrapes_at_once_neither_lose_nor_double_an_event(
    org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both scrapes are inside their transaction before either reads the watermark (a
    rendezvous): the row lock makes the second wait for the first's commit and find the
    watermark moved; without it both would add the same events to the totals."""
    rng = random.Random(3)
    write(lives(org, rng, 20, NOW - timedelta(hours=5), 3600))
    job_event_tallies(now=NOW - timedelta(days=1))  # makes the watermark row; settles nothing
    meet = rendezvous(2)
    locked: Callable[[], int] = metrics_tally._locked_mark

    def after_meeting() -> int:
        meet()
        return locked()

    monkeypatch.setattr(metrics_tally, "_locked_mark", after_meeting)
    expected = recount().as_plain()
    results = run_in_threads(
        lambda: job_event_tallies(now=NOW).as_plain(),
        lambda: job_event_tallies(now=NOW).as_plain(),
    )
    assert results == [("ok", expected), ("ok", expected)]
    monkeypatch.setattr(metrics_tally, "_locked_mark", locked)
    assert job_event_tallies(now=NOW).as_plain() == expected
    tallied = sum(EventTally.objects.filter(kind="wait").values_list("n", flat=True))
    assert tallied == sum(sum(buckets) for buckets in expected[0].values())


def queries_of(now: datetime) -> int:
    with CaptureQueriesContext(connection) as captured:
        job_event_tallies(now=now)
    return len(captured.captured_queries)


@pytest.mark.django_db
def test_a_scrape_reads_the_events_past_the_watermark_in_a_fixed_number_of_queries(
    org: Org,
) -> None:
    """Lock the watermark, find how far it may move, read the totals, the admissions and the
    preemptions past it (5); add what settled and move the watermark (2 more); the savepoint
    of the test's transaction (2). Whatever the size of the history."""
    rng = random.Random(5)
    job_event_tallies(now=NOW)  # the watermark row exists from the first scrape on
    write(lives(org, rng, 30, NOW - timedelta(hours=30), 3600))
    assert queries_of(NOW) == 9  # events settle
    assert queries_of(NOW) == 7  # nothing new
    write(lives(org, rng, 60, NOW - timedelta(hours=30), 3600))
    write(lives(org, rng, 5, NOW - timedelta(seconds=30), 20, quick=True))
    assert queries_of(NOW) == 9
    assert queries_of(NOW) == 7  # the recent ones are read again, in the same queries
