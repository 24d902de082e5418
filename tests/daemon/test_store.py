"""The daemon's bulk writes (`scheduler.daemon.store`): reasons only to queued jobs, and the
compare-and-swaps and the release finding their rows by key whatever the statistics."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from scheduler.daemon.store import release
from scheduler.models import Allocation, Job
from tests.daemon.conftest import Env
from tests.factories import row_columns


def test_reasons_are_written_only_to_queued_jobs(env: Env) -> None:
    from scheduler.daemon.store import set_reasons

    queued, cancelled = env.submit(), env.submit()
    Job.objects.filter(pk=cancelled.pk).update(state="cancelled", reason="cancelled by alice")
    versions: dict[int, int] = {}
    assert set_reasons({queued.pk: "waiting", cancelled.pk: "waiting"}, versions) == 1
    # the new row version is known on PostgreSQL only (xmin)
    assert list(versions) == ([queued.pk] if connection.vendor == "postgresql" else [])
    assert Job.objects.get(pk=cancelled.pk).reason == "cancelled by alice"
    assert Job.objects.get(pk=queued.pk).reason == "waiting"


@pytest.mark.postgresql("the planner's choice of index")
@pytest.mark.parametrize("statement", ["claim", "reasons"])
def test_compare_and_swaps_find_their_rows_by_key_whatever_the_statistics(
    env: Env, statement: str
) -> None:
    """The claim's and the reasons' UPDATEs find the jobs they write by primary key. With
    the state test written plainly, the planner took the partial index of queued jobs
    after a burst of submissions it had no statistics for, and read every queued job to
    write a hundred (the statistics below say the queue holds one)."""
    from scheduler.daemon.store import REASONS_SQL
    from scheduler.jobs.transitions import CLAIM_SQL

    first = env.submit()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE scheduler_job")
    fields = row_columns(first)
    burst = Job.objects.bulk_create([Job(**fields) for _ in range(3000)])
    ids = [job.pk for job in burst[:100]]
    if statement == "claim":
        sql = CLAIM_SQL.format(sets="", skip=" SKIP LOCKED")
        params = ["admitted", "", timezone.now(), ids, "queued"]
    else:
        sql, params = REASONS_SQL, [ids, ["waiting"] * len(ids), "queued"]
    with connection.cursor() as cursor:
        # Which index, is the question: in a test database bloated by earlier tests' rolled
        # back rows, stale statistics can make a sequential scan cost least, which says
        # nothing about the indexes (and does not happen on a table as large as it looks).
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "scheduler_job_pkey" in plan, plan
    assert "job_queue_heads" not in plan and "job_queue_order" not in plan, plan


@pytest.mark.postgresql("the planner's choice of index")
def test_release_finds_its_allocations_by_key_whatever_the_statistics(env: Env) -> None:
    """Ending allocations finds them by primary key. With `ended_at IS NULL` written
    plainly, the planner took a partial index of the active allocations after a burst it
    had no statistics for (and such an index keeps an entry for every allocation ended
    since the last VACUUM)."""
    from scheduler.daemon.store import RELEASE_SQL

    env.submit(simulation={"duration_s": 600})
    env.run(env.daemon())
    first = Allocation.objects.get()
    fields = row_columns(first)
    ended = [
        Allocation(**{**fields, "replica": i + 1, "ended_at": timezone.now()}) for i in range(3000)
    ]
    Allocation.objects.bulk_create(ended)  # the history: many ended, one active
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE scheduler_allocation")
    burst = Allocation.objects.bulk_create(
        [Allocation(**{**fields, "replica": i + 1, "pod_name": f"burst-{i}"}) for i in range(3000)]
    )
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + RELEASE_SQL, [timezone.now(), "x", [a.pk for a in burst[:100]]])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "scheduler_allocation_pkey" in plan, plan
    assert "allocation_one_active" not in plan and "allocation_active" not in plan, plan
    assert release([a.pk for a in burst[:100]], timezone.now(), "x") == 100
    assert release([a.pk for a in burst[:100]], timezone.now(), "x") == 0  # ended already


def test_allocations_and_their_shares_are_written_together_in_the_rows_order(env: Env) -> None:
    """`insert_allocations`: the ids come back in the rows' order, each allocation with
    exactly its own shares (a CPU-only replica with none), and the devices' trigger counts
    the shares as allocated."""
    from scheduler.daemon.store import ALLOCATION_COLUMNS, insert_allocations
    from scheduler.models import AllocationDevice, GpuDevice

    env.run(env.daemon())  # the inventory (nodes and their devices) as a cycle writes it
    jobs = [env.submit() for _ in range(3)]
    node = GpuDevice.objects.order_by("id").first().node  # type: ignore[union-attr]
    devices = list(GpuDevice.objects.filter(node=node).order_by("index"))
    now = timezone.now()
    rows, shares = [], []
    for n, (job, per) in enumerate(
        zip(
            jobs,
            [
                [(devices[0].pk, 1000, 0), (devices[1].pk, 500, 2048)],
                [],
                [(devices[2].pk, 1000, 0)],
            ],
            strict=True,
        )
    ):
        values = {
            "job_id": job.pk, "node_id": node.pk, "attempt": 0, "replica": 0,
            "pod_name": f"pod-{n}", "namespace": "ns", "flavor": node.flavor,
            "gpu_milli": sum(m for _, m, _ in per), "elastic": n == 1, "epoch": 7,
            "started_at": now, "end_reason": "",
        }  # fmt: skip
        rows.append(tuple(values[c] for c in ALLOCATION_COLUMNS))
        shares.append(per)
    ids = insert_allocations(rows, shares)
    assert ids == sorted(ids) and len(set(ids)) == 3
    made = {a.pk: a for a in Allocation.objects.filter(pk__in=ids)}
    for allocation_id, row, per in zip(ids, rows, shares, strict=True):
        got = made[allocation_id]
        assert tuple(getattr(got, c) for c in ALLOCATION_COLUMNS) == row
        assert sorted(
            AllocationDevice.objects.filter(allocation_id=allocation_id).values_list(
                "device_id", "milli", "memory_mib", "released"
            )
        ) == sorted((*share, False) for share in per)
    if connection.vendor == "postgresql":  # the trigger (SQLite: its own, tested elsewhere)
        assert GpuDevice.objects.get(pk=devices[1].pk).allocated_milli == 500
