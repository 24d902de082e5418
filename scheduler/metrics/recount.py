"""The job-event counters of /metrics counted over the whole history, as /metrics did before
it kept running totals: the reference that the totals must equal (tests/metrics/
test_event_tallies.py) and the "before" of bench/metrics_scrape.py. Not used by a scrape."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import BigIntegerField, Count, OuterRef, Subquery
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from scheduler.metrics.tally import WAIT_BUCKETS_S, Tallies
from scheduler.models import Job, JobEvent, JobState
from tenants.models import PriorityClass, Tenant

S = JobState


def recount() -> Tallies:
    tallies = Tallies()
    with connection.cursor() as cursor:
        cursor.execute(*_waits_sql())
        for slug, klass, index, n, total in cursor.fetchall():
            tallies.add_wait(slug, klass, index, n, float(total or 0))
    preemptor_tenant = Job.objects.filter(pk=OuterRef("preemptor")).values("tenant__slug")
    rows = (
        JobEvent.objects.filter(kind="preempted")
        .annotate(preemptor=Cast(KT("data__preemptor"), BigIntegerField()))
        .annotate(by=Subquery(preemptor_tenant[:1]))
        .values_list("job__tenant__slug", "job__priority_class__counts_against_quota", "by")
        .annotate(n=Count("id"))
        .order_by()
    )
    for victim, counts_against_quota, preemptor, n in rows:
        tallies.preemptions[(victim, counts_against_quota, preemptor)] += n
    return tallies


def _waits_sql() -> tuple[str, list[Any]]:
    """Admissions by tenant, class and wait bucket, with their count and summed wait (s): a
    window over every job's queue entries and admissions in id order."""
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
        f"SELECT t.slug, c.name, CASE {buckets} ELSE {len(WAIT_BUCKETS_S)} END,"  # noqa: S608 - our names
        " COUNT(*), SUM(w.waited)"
        f" FROM (SELECT e.job_id, e.to_state, {seconds} AS waited,"
        " LAG(e.to_state) OVER entries AS previous"
        f" FROM {event} e WHERE e.to_state IN (%s, %s)"
        " WINDOW entries AS (PARTITION BY e.job_id ORDER BY e.id)) w"
        f" JOIN {job} j ON j.id = w.job_id JOIN {tenant} t ON t.id = j.tenant_id"
        f" JOIN {klass} c ON c.id = j.priority_class_id"
        " WHERE w.to_state = %s AND w.previous = %s GROUP BY 1, 2, 3"
    )
    return sql, [S.QUEUED, S.ADMITTED, S.ADMITTED, S.QUEUED]
