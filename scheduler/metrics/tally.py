"""The job-event counters of /metrics (admissions and their waits, preemptions) as running
totals: `EventTally` rows advanced past a watermark of `JobEvent` ids, so that a scrape reads
the events written since the last one, not the whole history (docs/metrics.md).

Each scrape, in one transaction holding the watermark's row lock (two scrapes at once take
turns; the second finds the watermark moved and adds nothing twice):
1. settle: the watermark may move to the last event older than GRACE that has no newer event
   below it. Events are appended with rising ids, but a transaction that took its id earlier
   may commit later than one that took a higher id: a straggler, invisible until then. It
   took its id after every visible event below it, so if the watermark stops at an old event,
   a straggler below that one has been open longer than GRACE, which no writer does;
2. read the totals so far;
3. count the events past the watermark, in one query per family, marked settled or not;
4. add the settled counts to the totals (an upsert per label set) and move the watermark.
The scrape serves totals + all events past the old watermark, settled or not, so the series
are exact at every scrape (the same figures as a count over the whole history), and an event
that commits late, below the ids already seen but above the watermark, is counted when it
appears. Nothing is ever counted twice: a settled event is in the totals and past no longer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import (
    BigIntegerField,
    BooleanField,
    Count,
    Exists,
    ExpressionWrapper,
    Max,
    OuterRef,
    Q,
    Subquery,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from scheduler.models import Job, JobEvent, JobState
from scheduler.models.tallies import EventTally, EventTallyMark
from tenants.models import PriorityClass, Tenant

S = JobState
# Kueue's admission wait buckets: 1 s doubling to 8192 s (about 2 h 16 min).
WAIT_BUCKETS_S = tuple(float(2**i) for i in range(14))
# Longer than a transaction that writes job events stays open after taking an event's id
# (the daemon's are fenced by a 30 s lease; a web request is cut by the server's timeout),
# plus the clock difference between the hosts that stamp `at`. Only this much of the
# history is counted at each scrape on top of the totals.
GRACE = timedelta(minutes=2)
MARK = "job-events"


@dataclass
class Tallies:
    """Counts by label names: `waits[(tenant, class)]` per bucket (the last +Inf, not
    cumulative) with `wait_sums` in seconds; `preemptions[(victim tenant, victim class
    counts against quota, preemptor's tenant or None for a drain)]`."""

    waits: dict[tuple[str, str], list[int]] = field(
        default_factory=lambda: defaultdict(lambda: [0] * (len(WAIT_BUCKETS_S) + 1))
    )
    wait_sums: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    preemptions: dict[tuple[str, bool, str | None], int] = field(
        default_factory=lambda: defaultdict(int)
    )

    def add_wait(self, slug: str, klass: str, bucket: int, n: int, seconds: float) -> None:
        self.waits[(slug, klass)][bucket] += n
        self.wait_sums[(slug, klass)] += seconds

    def as_plain(self) -> tuple[dict[Any, list[int]], dict[Any, float], dict[Any, int]]:
        """For comparing two tallies: no zero rows, sums rounded off float noise."""
        waits = {k: v for k, v in self.waits.items() if any(v)}
        sums = {k: round(v, 6) for k, v in self.wait_sums.items() if k in waits}
        return waits, sums, {k: v for k, v in self.preemptions.items() if v}


def job_event_tallies(*, now: datetime) -> Tallies:
    """The counters as of `now` (the scrape's clock: events older than `now - GRACE` may
    settle into the totals). One transaction of five queries, seven when the watermark moves."""
    with transaction.atomic():
        after = _locked_mark()  # one scrape at a time past this point
        upto = _settled_upto(after, now - GRACE)  # 1. settle
        tallies = _totals()  # 2. the totals so far
        settled: list[tuple[str, int, int, int, int, int, float]] = []
        for row in _wait_rows(after, upto):  # 3. past the watermark
            slug, klass, tenant_id, klass_id, bucket, is_settled, n, seconds = row
            tallies.add_wait(slug, klass, bucket, n, float(seconds or 0))
            if is_settled:
                settled.append(("wait", tenant_id, klass_id, 0, bucket, n, float(seconds or 0)))
        for row in _preemption_rows(after, upto):
            slug, tenant_id, klass_id, counts, by_id, by_slug, is_settled, n = row
            tallies.preemptions[(slug, counts, by_slug)] += n
            if is_settled:
                settled.append(("preempted", tenant_id, klass_id, by_id or 0, 0, n, 0.0))
        if upto > after:  # 4. what settled joins the totals, and the watermark moves
            _add(settled)
            EventTallyMark.objects.filter(name=MARK).update(event_id=upto)
    return tallies


def _locked_mark() -> int:
    """The watermark, its row locked until the transaction ends."""
    mark = EventTallyMark.objects.select_for_update().filter(name=MARK).values("event_id")
    found = mark.first()
    if found is None:  # the first scrape ever: two may race to make the row
        EventTallyMark.objects.bulk_create([EventTallyMark(name=MARK)], ignore_conflicts=True)
        found = mark.get()
    return int(found["event_id"])


def _settled_upto(after: int, cutoff: datetime) -> int:
    """The highest id the watermark may reach: the last event older than `cutoff` below the
    first one newer than it. Not the id before that newer one: an event still uncommitted
    (invisible) may hold an id in between; it took its id after the old event below and so
    is recent, and it is counted when it commits, past the watermark."""
    recent = JobEvent.objects.filter(id__gt=after, at__gte=cutoff).order_by("id")
    below = Q(id__lt=Subquery(recent.values("id")[:1])) | ~Exists(recent)
    found = JobEvent.objects.filter(below, id__gt=after).aggregate(last=Max("id"))
    return int(found["last"]) if found["last"] is not None else after


def _totals() -> Tallies:
    tally, tenant = EventTally._meta.db_table, Tenant._meta.db_table
    klass = PriorityClass._meta.db_table
    sql = (
        "SELECT x.kind, t.slug, c.name, c.counts_against_quota, b.slug, x.bucket, x.n,"  # noqa: S608 - our names
        f" x.seconds FROM {tally} x JOIN {tenant} t ON t.id = x.tenant_id"
        f" JOIN {klass} c ON c.id = x.klass_id LEFT JOIN {tenant} b ON b.id = x.by_tenant_id"
    )
    tallies = Tallies()
    with connection.cursor() as cursor:
        cursor.execute(sql)
        for kind, slug, name, counts, by_slug, bucket, n, seconds in cursor.fetchall():
            if kind == "wait":
                tallies.add_wait(slug, name, bucket, n, seconds)
            else:
                tallies.preemptions[(slug, bool(counts), by_slug)] += n
    return tallies


def _wait_rows(after: int, upto: int) -> list[tuple[Any, ...]]:
    """Admissions with an id past `after`, by tenant, class, wait bucket and whether they
    settle (id <= `upto`): name and id of each, count and summed wait (s).

    A job's entries into the queue and its admissions alternate (queued, admitted, queued
    after a requeue, admitted...): each admission's wait is the time since the event before
    it in that sequence, a window over the job's events in id order, over the whole history
    of the jobs admitted past the watermark (their earlier events included)."""
    event, job = JobEvent._meta.db_table, Job._meta.db_table
    tenant, klass = Tenant._meta.db_table, PriorityClass._meta.db_table
    if connection.vendor == "postgresql":
        seconds = "EXTRACT(EPOCH FROM e.at - LAG(e.at) OVER entries)"
    else:  # SQLite keeps times as ISO text
        seconds = "(julianday(e.at) - julianday(LAG(e.at) OVER entries)) * 86400.0"
    buckets = " ".join(
        f"WHEN w.waited <= {bound!r} THEN {index}" for index, bound in enumerate(WAIT_BUCKETS_S)
    )
    sql = (
        "SELECT t.slug, c.name, t.id, c.id,"  # noqa: S608 - our names
        f" CASE {buckets} ELSE {len(WAIT_BUCKETS_S)} END, w.id <= %s, COUNT(*), SUM(w.waited)"
        f" FROM (SELECT e.id, e.job_id, e.to_state, {seconds} AS waited,"
        " LAG(e.to_state) OVER entries AS previous"
        f" FROM {event} e WHERE e.to_state IN (%s, %s) AND e.job_id IN"
        f" (SELECT n.job_id FROM {event} n WHERE n.id > %s AND n.to_state = %s)"
        " WINDOW entries AS (PARTITION BY e.job_id ORDER BY e.id)) w"
        f" JOIN {job} j ON j.id = w.job_id JOIN {tenant} t ON t.id = j.tenant_id"
        f" JOIN {klass} c ON c.id = j.priority_class_id"
        " WHERE w.id > %s AND w.to_state = %s AND w.previous = %s GROUP BY 1, 2, 3, 4, 5, 6"
    )
    params: list[Any] = [upto, S.QUEUED, S.ADMITTED, after, S.ADMITTED, after, S.ADMITTED, S.QUEUED]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [(*row[:5], bool(row[5]), *row[6:]) for row in cursor.fetchall()]


def _preemption_rows(after: int, upto: int) -> list[tuple[Any, ...]]:
    """`preempted` events past `after` by the victim's tenant and class and the preemptor's
    tenant (None: no preemptor, a drain), and whether they settle (id <= `upto`)."""
    preemptor = Job.objects.filter(pk=OuterRef("preemptor"))
    rows = (
        JobEvent.objects.filter(kind="preempted", id__gt=after)
        .annotate(preemptor=Cast(KT("data__preemptor"), BigIntegerField()))
        .annotate(
            by_id=Subquery(preemptor.values("tenant_id")[:1]),
            by_slug=Subquery(preemptor.values("tenant__slug")[:1]),
            settled=ExpressionWrapper(Q(id__lte=upto), output_field=BooleanField()),
        )
        .values_list(
            "job__tenant__slug",
            "job__tenant_id",
            "job__priority_class_id",
            "job__priority_class__counts_against_quota",
            "by_id",
            "by_slug",
            "settled",
        )
        .annotate(n=Count("id"))
        .order_by()
    )
    return list(rows)


def _add(rows: list[tuple[str, int, int, int, int, int, float]]) -> None:
    """Add counts to the totals: one upsert of every label set (the row lock on the watermark
    is held, but the upsert alone never loses an addition either)."""
    merged: dict[tuple[str, int, int, int, int], list[float]] = defaultdict(lambda: [0, 0.0])
    for kind, tenant_id, klass_id, by_id, bucket, n, seconds in rows:
        merged[(kind, tenant_id, klass_id, by_id, bucket)][0] += n
        merged[(kind, tenant_id, klass_id, by_id, bucket)][1] += seconds
    if not merged:
        return
    table = EventTally._meta.db_table
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(merged))
    sql = (
        f"INSERT INTO {table} (kind, tenant_id, klass_id, by_tenant_id, bucket, n, seconds)"  # noqa: S608 - our names
        f" VALUES {values} ON CONFLICT (kind, tenant_id, klass_id, by_tenant_id, bucket)"
        f" DO UPDATE SET n = {table}.n + excluded.n, seconds = {table}.seconds + excluded.seconds"
    )
    params: list[Any] = [v for key, (n, seconds) in merged.items() for v in (*key, int(n), seconds)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
