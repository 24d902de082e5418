"""Metering: allocations -> usage records, one closed hour at a time.

The metering rule: an allocation holds its devices (its GPU share), and its job's per-replica
CPU and memory, from its `started_at` (the devices are reserved then, before the pod is even
bound) to its `ended_at` (the daemon released them); an allocation not ended yet holds them
to the end of the hour being metered. Time is kept to the microsecond, as the database keeps it.

Crash order, per hour, all in ONE transaction:
  1. claim: insert the hour's MeteringPeriod row (unique start; a concurrent run blocks on it
     and then finds it taken, and skips the hour);
  2. read the allocations that overlap the hour (a run reads those of a window of up to
     WINDOW_HOURS due hours in one query, in the transaction of the first hour it claims,
     and takes each hour's from there: the hours are closed, so what overlaps them is
     settled);
  3. write one usage record per allocation (unique per allocation and hour), and the
     guarantees and devices of the hour (see below);
  4. finish: store the count on the period row.
A run that dies anywhere in 1-4 rolls back the whole hour: the period row and its records
exist together or not at all, so the next run meters the hour completely. An hour is metered
only once it is closed, and `GANTRY_METERING_DELAY_S` after that, so the daemon's last writes
about it are in.

Quotas and the inventory keep no history, so the guarantees and the devices of an hour are
read when the hour is metered: a quota changed, or a node cordoned, between the end of the
hour and its metering counts for the whole hour (docs/billing.md: the approximation).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Field, JSONField, Min, Model, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce

from billing.budgets.spend import SpendRun, spend_metered
from billing.models import CapacityRecord, GuaranteeRecord, MeteringPeriod, UsageRecord
from scheduler.models import Allocation, Cluster, GpuDevice
from tenants.models import Quota

HOUR = timedelta(hours=1)
MICROSECOND = timedelta(microseconds=1)
# The most hours one run meters; the next run goes on (a run stays short after an outage).
MAX_HOURS_PER_RUN = 24 * 7

Fault = Callable[[str], None]


def floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def hours_due(now: datetime, limit: int | None = MAX_HOURS_PER_RUN) -> list[datetime]:
    """Closed hours not metered yet, oldest first: from the first allocation's hour to the
    last hour that ended at least the metering delay before `now` (at most `limit`)."""
    until = floor_hour(now - timedelta(seconds=settings.GANTRY_METERING_DELAY_S))
    first = Allocation.objects.aggregate(first=Min("started_at"))["first"]
    if first is None:
        return []
    hour = floor_hour(first)
    done = set(
        MeteringPeriod.objects.filter(start__gte=hour, start__lt=until).values_list(
            "start", flat=True
        )
    )
    due: list[datetime] = []
    while hour < until and (limit is None or len(due) < limit):
        if hour not in done:
            due.append(hour)
        hour += HOUR
    return due


# Due hours read together: the allocations overlapping a window of up to this many hours are
# read in one query; each hour is still claimed and written in its own transaction.
WINDOW_HOURS = 24


def meter_usage(*, now: datetime, fault: Fault | None = None) -> int:
    """Meter every closed hour that is due; the number of hours this run metered."""
    # Imported here: late usage builds on this module's reading and writing of records.
    from billing.metering.late import late_usage_meter

    metered = 0
    spend = SpendRun()
    try:
        # First, what was written since the last run into hours metered before it.
        late_usage_meter(now=now, spend=spend)
        for hours in _windows(hours_due(now)):
            window = Window(hours[0], hours[-1] + HOUR)
            metered += sum(
                meter_hour(hour, now=now, fault=fault, window=window, spend=spend) for hour in hours
            )
    finally:
        # Once per run, also when an hour failed: the hours committed before it moved spend.
        spend.alerts_queue()
    return metered


Progress = Callable[[int, int], None]


def meter_caught_up(*, now: datetime, progress: Progress | None = None) -> int:
    """Meter every closed hour due, however many (`meter_usage` runs until none is left):
    what closing a month needs. `progress(done, due)` after each run of up to
    MAX_HOURS_PER_RUN hours. Stops early when a run meters nothing (another run holds the
    hours left; the caller's check that the period is metered then says what is missing).
    Returns the hours metered."""
    due = len(hours_due(now, limit=None))
    done = 0
    while due > done:
        metered = meter_usage(now=now)
        done += metered
        if progress is not None:
            progress(done, due)
        if not metered:
            break
    return done


def _windows(hours: list[datetime]) -> list[list[datetime]]:
    """Due hours (ascending) in groups spanning at most WINDOW_HOURS."""
    groups: list[list[datetime]] = []
    for hour in hours:
        if groups and hour - groups[-1][0] < WINDOW_HOURS * HOUR:
            groups[-1].append(hour)
        else:
            groups.append([hour])
    return groups


def meter_hour(
    start: datetime,
    *,
    now: datetime,
    fault: Fault | None = None,
    window: Window | None = None,
    spend: SpendRun | None = None,
) -> bool:
    """Meter [start, start + 1 h) unless another run did; True when this run metered it.
    `window`: what this run read for several hours (read here, for this hour, when None);
    `spend`: the budgets' state of the run (rates read once, alerts checked at its end).
    `fault(step)` is called between the steps (tests kill the run there)."""
    step = fault or (lambda name: None)
    end = start + HOUR
    window = window or Window(start, end)
    try:
        with transaction.atomic():
            # 1. claim
            period = MeteringPeriod.objects.create(start=start, end=end, metered_at=now)
            step("claimed")
            # 2. read (the window reads once, in the transaction of its first hour claimed)
            held = window.overlapping(start, end)
            step("read")
            # 3. write
            records = [
                r for r in (record_of(period, h, start, end) for h in held) if r.end > r.start
            ]
            write_records(records)
            _record_guarantees_and_capacity(period, window)
            # After the hour is written, in its transaction:
            spend_metered(period, records, spend)
            step("written")
            # 4. finish
            period.records = len(held)
            period.save(update_fields=["records"])
            step("finished")
    except IntegrityError:
        # The hour (or a record of it) is there already: another run metered it.
        if MeteringPeriod.objects.filter(start=start).exists():
            return False
        raise
    return True


class Held(NamedTuple):
    """An allocation as metering reads it (with its job's figures)."""

    id: int
    job_id: int
    started_at: datetime
    ended_at: datetime | None
    flavor: str
    device_milli: int | None
    cpu_milli: int
    memory_mib: int
    tenant_id: int
    project_id: int
    user_id: int
    priority_class: str
    job_type: str
    counts_against_quota: bool
    cluster: str  # the name of the cluster of the allocation's node


class Record(NamedTuple):
    """A usage record to write: UsageRecord's columns. `allocation` is the Held row (the
    budgets hook reads `record.allocation.job_id`)."""

    period_id: int
    allocation: Held
    start: datetime
    end: datetime
    flavor: str
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    tenant_id: int
    project_id: int
    user_id: int
    priority_class: str
    job_type: str
    borrowed: bool
    micros: int  # end - start
    cluster: str


Devices = dict[tuple[str, str], tuple[list[int], list[int]]]  # (flavor, cluster) -> ids


class Window:
    """What a run reads once for consecutive due hours [start, end): the allocations that
    overlap them, the guarantees and the devices. Read lazily, on the first hour claimed."""

    def __init__(self, start: datetime, end: datetime) -> None:
        self.start, self.end = start, end
        self._held: list[Held] | None = None
        self.guarantees: list[tuple[int, str, int, str]] = []
        self.devices: Devices = {}

    def overlapping(self, start: datetime, end: datetime) -> list[Held]:
        """The allocations that overlap [start, end) inside the window, by id."""
        if self._held is None:
            self._held = _overlapping(self.start, self.end)
            self.guarantees = _guarantees()
            self.devices = _devices()
        return [
            h
            for h in self._held
            if h.started_at < end and (h.ended_at is None or h.ended_at > start)
        ]


def _overlapping(start: datetime, end: datetime) -> list[Held]:
    return held_rows(
        Allocation.objects.filter(started_at__lt=end).filter(
            Q(ended_at__isnull=True) | Q(ended_at__gt=start)
        )
    )


def held_rows(allocations: QuerySet[Allocation]) -> list[Held]:
    """`allocations` as metering reads them, by id."""
    rows = (
        allocations.annotate(device_milli=Sum("devices__milli"), cluster_name=node_cluster_name())
        .order_by("id")
        .values_list(
            "id",
            "job_id",
            "started_at",
            "ended_at",
            "flavor",
            "device_milli",
            "job__cpu_milli",
            "job__memory_mib",
            "job__tenant_id",
            "job__project_id",
            "job__submitted_by_id",
            "job__priority_class__name",
            "job__job_type",
            "job__priority_class__counts_against_quota",
            "cluster_name",
        )
    )
    return [Held(*row) for row in rows]


def node_cluster_name() -> Coalesce:
    """The cluster of an allocation's (or a device's) node: a node without one (inserted by
    the release before clusters) is the home cluster's, as everywhere (docs/multicluster.md)."""
    home = Cluster.objects.filter(home=True).values("name")[:1]
    return Coalesce(F("node__cluster__name"), Subquery(home), Value(""))


def record_of(period: MeteringPeriod, held: Held, start: datetime, end: datetime) -> Record:
    held_from = max(held.started_at, start)
    held_to = end if held.ended_at is None else min(held.ended_at, end)
    return Record(
        period.pk,
        held,
        held_from,
        held_to,
        held.flavor,
        # The device shares are the ledger of what is held; a job without devices (CPU
        # only) holds none, whatever `gpu_milli` says.
        held.device_milli or 0,
        held.cpu_milli,
        held.memory_mib,
        held.tenant_id,
        held.project_id,
        held.user_id,
        held.priority_class,
        held.job_type,
        not held.counts_against_quota,
        (held_to - held_from) // MICROSECOND,
        held.cluster,
    )


COLUMNS = Record._fields


def write_records(rows: list[Record]) -> None:
    """Insert the hour's records: COPY on PostgreSQL (the bulk of metering's writes),
    bulk_create elsewhere. Either way in the hour's transaction, and the unique
    (allocation, period) refuses a second record of an allocation in the hour."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        UsageRecord.objects.bulk_create(_model(r) for r in rows)
        return
    columns = ", ".join(connection.ops.quote_name(_column(name)) for name in COLUMNS)
    table = connection.ops.quote_name(UsageRecord._meta.db_table)
    with connection.cursor() as cursor:
        raw = cursor.cursor
        # Binary, with the columns' types given once: no text to make per value on either
        # side (the text format cost several times more per record).
        with raw.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(_column_types())
            for r in rows:
                copy.write_row((r.period_id, r.allocation.id, *r[2:]))


def _column_types() -> list[str]:
    """The PostgreSQL types of COLUMNS, as psycopg names them (`varchar(63)` is `varchar`)."""
    types = []
    for name in COLUMNS:
        field = UsageRecord._meta.get_field(name)
        assert isinstance(field, Field)
        db_type = field.db_type(connection)
        assert db_type is not None
        types.append(db_type.split("(")[0])
    return types


def _column(name: str) -> str:
    return _column_of(UsageRecord._meta.get_field(name))


def _column_of(field: Any) -> str:
    assert isinstance(field, Field) and field.column is not None
    return field.column


def _model(record: Record) -> UsageRecord:
    values = record._asdict()
    held = values.pop("allocation")
    return UsageRecord(allocation_id=held.id, **values)


def _guarantees() -> list[tuple[int, str, int, str]]:
    """(tenant, flavor, guaranteed milli, cluster): the global quotas ("") and the pinned
    ones (their cluster's name)."""
    return list(
        Quota.objects.filter(guaranteed_milli__gt=0)
        .annotate(cluster_name=Coalesce(F("cluster__name"), Value("")))
        .values_list("tenant_id", "flavor__name", "guaranteed_milli", "cluster_name")
    )


def _devices() -> Devices:
    """The present devices per flavor and cluster, available or not."""
    devices: Devices = {}
    rows = GpuDevice.objects.filter(node__present=True).values_list(
        "id",
        "node__flavor",
        node_cluster_name(),  # a device's node's, as an allocation's
        "healthy",
        "node__ready",
        "node__cordoned",
        "node__cluster_unschedulable",
    )
    for device_id, flavor, cluster, healthy, ready, cordoned, unschedulable in rows.order_by("id"):
        available, unavailable = devices.setdefault((flavor, cluster), ([], []))
        ok = healthy and ready and not cordoned and not unschedulable
        (available if ok else unavailable).append(device_id)
    return devices


def _record_guarantees_and_capacity(period: MeteringPeriod, window: Window) -> None:
    # One INSERT each, without a model instance per row: the same rows every hour of the
    # window, but for the period.
    _insert(
        GuaranteeRecord,
        ("period", "tenant", "flavor", "guaranteed_milli", "cluster"),
        [(period.pk, *guarantee) for guarantee in window.guarantees],
    )
    _insert(
        CapacityRecord,
        ("period", "flavor", "cluster", "available", "unavailable"),
        [
            (period.pk, flavor, cluster, a, u)
            for (flavor, cluster), (a, u) in window.devices.items()
        ],
    )


def _insert(model: type[Model], names: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    if not rows:
        return
    fields = [model._meta.get_field(name) for name in names]
    assert all(isinstance(field, Field) for field in fields)
    columns = ", ".join(connection.ops.quote_name(_column_of(field)) for field in fields)
    preps = [field.get_db_prep_save if isinstance(field, JSONField) else None for field in fields]
    params = [
        value if prep is None else prep(value, connection)
        for row in rows
        for prep, value in zip(preps, row, strict=True)
    ]
    values = ", ".join(["(" + ", ".join(["%s"] * len(fields)) + ")"] * len(rows))
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} ({columns}) VALUES {values}", params)  # noqa: S608 - names from the model
