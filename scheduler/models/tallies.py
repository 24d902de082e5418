"""Running totals of the job-event counters that /metrics serves (scheduler/metrics/tally.py)."""

from __future__ import annotations

from django.db import models


class EventTally(models.Model):
    """One counter (and for the wait histogram, one bucket) per label set, advanced past
    `EventTallyMark`. Ids rather than foreign keys: the names are joined at the scrape, and
    a counter must not fall when a job or class is deleted (Prometheus counters only rise).

    kind `wait`: admissions of jobs of `tenant_id` and class `klass_id` whose wait fell in
    `bucket` (the index into WAIT_BUCKETS_S, the last one +Inf), and their waits' sum.
    kind `preempted`: `preempted` events of jobs of `tenant_id` and class `klass_id`, by a
    job of `by_tenant_id` (0: no preemptor, a drain)."""

    kind = models.CharField(max_length=16)
    tenant_id = models.BigIntegerField()
    klass_id = models.BigIntegerField()
    by_tenant_id = models.BigIntegerField(default=0)
    bucket = models.SmallIntegerField(default=0)
    n = models.BigIntegerField(default=0)
    seconds = models.FloatField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "tenant_id", "klass_id", "by_tenant_id", "bucket"],
                name="eventtally_once",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.tenant_id}/{self.klass_id}/{self.by_tenant_id}: {self.n}"


class EventTallyMark(models.Model):
    """Every job event with an id up to `event_id` is in the tallies, none above it. Its row
    lock serialises the scrapes that advance it."""

    name = models.CharField(max_length=16, unique=True)
    event_id = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} tallied up to event {self.event_id}"
