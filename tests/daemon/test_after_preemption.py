"""Issue 17, point 1: on the embedded default (SQLite) the daemon stopped for good after the
first preemption. The next cycle read the victim's `preempted` event through a raw cursor,
which gives SQLite's naive time, compared it with an aware one (TypeError), dropped the lease,
and a restarted daemon failed the same way while the event stayed in the look-back window.
These run on both databases (`make test` runs the suite on each)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler.daemon.rows import aware
from scheduler.models import Job, SchedulerLease
from tests.daemon.conftest import Env, assert_consistent


def test_the_daemon_and_a_restarted_one_keep_scheduling_after_a_reclaim(env: Env) -> None:
    # alpha borrows the whole cluster (4 x 8 H100), then bravo claims its guarantee back
    for _ in range(4):
        env.submit(resources={"gpus": 8}, simulation={"duration_s": 10_000})
    daemon = env.daemon()
    daemon.profile = type(daemon.profile)(min_runtime_s=0)
    env.run(daemon, seconds=2, cycles=2)
    assert Job.objects.filter(state="running").count() == 4
    vision = env.submit(user="bob-bravo", resources={"gpus": 8}, simulation={"duration_s": 60})
    env.run(daemon, seconds=1, cycles=4)  # the reclaim, then cycles that read its event
    assert (
        Job.objects.filter(state="preempted").count()
        + Job.objects.filter(state="queued", attempt=1).count()
        == 1
    )
    vision.refresh_from_db()
    assert vision.state in ("binding", "running")
    assert daemon.lease.leading and SchedulerLease.objects.get().cycle_failures == 0
    # a restart while the preemption is still in the look-back window
    restarted = env.daemon("restarted")
    daemon.lease.release()
    late = env.submit(user="bob-bravo", resources={"gpus": 1}, simulation={"duration_s": 60})
    env.run(restarted, seconds=1, cycles=2)
    assert restarted.lease.leading and SchedulerLease.objects.get().cycle_failures == 0
    late.refresh_from_db()
    assert late.state != "queued" or late.reason  # decided on: placed, or told why it waits
    assert_consistent(env.backend)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2026-12-03 21:00:00.250000", datetime(2026, 12, 3, 21, 0, 0, 250000, tzinfo=UTC)),
        (datetime(2026, 12, 3, 21, 0), datetime(2026, 12, 3, 21, 0, tzinfo=UTC)),
        (datetime(2026, 12, 3, 21, 0, tzinfo=UTC), datetime(2026, 12, 3, 21, 0, tzinfo=UTC)),
    ],
    ids=["sqlite-text", "naive", "aware"],
)
def test_raw_cursor_times_are_made_aware(raw: datetime | str, expected: datetime) -> None:
    assert aware(raw) == expected and aware(raw).tzinfo is not None


def test_the_engine_reads_each_models_per_user_cap(env: Env) -> None:
    """Per-flavor per-user caps reach the engine as they are: a cap of 0 on one model is kept,
    and another model's cap is not taken for it (they were collapsed to one, the lowest, and
    a 0 dropped)."""
    from scheduler.daemon.snapshot import build_snapshot
    from tenants.models import Quota

    Quota.objects.filter(tenant=env.org.alpha, flavor=env.org.h100).update(user_limit_milli=0)
    Quota.objects.create(tenant=env.org.alpha, flavor=env.org.a100, guaranteed_milli=0,
                         limit_milli=0, user_limit_milli=2000)  # fmt: skip
    tenants = {t.name: t for t in build_snapshot(env.clock(), decayed={}).snapshot.tenants}
    assert tenants["team-alpha"].user_caps == {"H100-80GB": 0, "A100-40GB": 2000}
