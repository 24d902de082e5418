"""Backfill: a reservation for the head job blocked on capacity; later jobs go around it."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core.types import WaitCode
from tests.scheduler.core.builders import (
    BEST_FIT,
    cycle,
    make_job,
    make_node,
    make_running,
    make_tenants,
    snapshot,
)

NOW = 1000.0


def cluster_half_busy():
    """n1 and n2 each run a 4-GPU job ending at 1000 + 600 (started 400, runtime 1200)."""
    nodes = [make_node("n1"), make_node("n2")]
    running = [
        make_running(make_job(f"r{i}", gpus=4, runtime=1200), (f"n{i}", range(4)), started_at=400)
        for i in (1, 2)
    ]
    return nodes, running


def test_head_job_gets_a_reservation_when_running_jobs_end():
    nodes, running = cluster_half_busy()
    big = make_job("big", gpus=8, submitted_at=0)  # needs a whole node: 4 + 4 free, not together
    result = cycle(snapshot(nodes, [big], running, now=NOW))
    assert len(result.reservations) == 1
    held = result.reservations[0]
    # r1 and r2 both end at 400 + 1200 = 1600; then a node is whole
    assert held.job_id == "big" and held.start_at == 1600.0
    assert len(held.devices) == 8 and len({node for node, _ in held.devices}) == 1


def test_later_job_runs_only_if_it_ends_before_the_reservation_or_avoids_it():
    nodes, running = cluster_half_busy()
    big = make_job("big", gpus=8, submitted_at=0)
    short = make_job("short", gpus=2, runtime=500, submitted_at=1)  # 1000 + 500 <= 1600
    longs = [make_job(f"long{i}", gpus=2, runtime=5000, submitted_at=2 + i) for i in range(4)]
    result = cycle(snapshot(nodes, [big, short, *longs], running, now=NOW))
    held = set(result.reservations[0].devices)
    assert result.placement_for("short") is not None
    # 8 devices free: 4 held for big, 4 not. short may use either; the long jobs only the
    # 4 unheld ones, so at most 2 of them (2 GPUs each) start and none on a held device.
    started = [p for p in result.placements if p.job_id.startswith("long")]
    assert 1 <= len(started) <= 2
    for p in started:
        used = {(a.node, s.device) for a in p.assignments for s in a.shares}
        assert not used & held
    waiting = [result.reason_for(j.id) for j in longs if result.placement_for(j.id) is None]
    assert waiting and all(w is not None and w.code == WaitCode.RESERVATION for w in waiting)


def test_reservation_reason_names_the_job_and_the_minutes():
    # one node; r ends at 400 + 1200 = 1600, i.e. in 10 min; "big" holds all 8 devices,
    # "small" (no runtime bound) would fit on the 4 free ones but must not delay "big"
    nodes = [make_node("n1")]
    running = [make_running(make_job("r", gpus=4, runtime=1200), ("n1", range(4)), started_at=400)]
    pending = [make_job("big", gpus=8), make_job("small", gpus=2, submitted_at=5)]
    result = cycle(snapshot(nodes, pending, running, now=NOW))
    reason = result.reason_for("small")
    assert reason is not None and reason.code == WaitCode.RESERVATION
    assert reason.message == "waiting for reservation of job big, expected in 10 min"


def test_without_backfill_later_jobs_take_the_free_devices():
    nodes = [make_node("n1")]
    running = [make_running(make_job("r", gpus=4, runtime=1200), ("n1", range(4)), started_at=400)]
    pending = [make_job("big", gpus=8), make_job("small", gpus=2, submitted_at=5)]
    result = cycle(snapshot(nodes, pending, running, now=NOW), replace(BEST_FIT, backfill=False))
    assert result.reservations == ()
    assert result.placement_for("small") is not None


def test_a_held_base_keeps_no_reservation_between_cycles():
    """A reservation holds devices for one cycle only: with the daemon's `Held` base, the
    next cycle (the big job gone) lets the long jobs use every free device again."""
    from scheduler.core import run_cycle
    from scheduler.core.context import Held

    nodes, running = cluster_half_busy()
    big = make_job("big", gpus=8, submitted_at=0)
    longs = [make_job(f"long{i}", gpus=2, runtime=5000, submitted_at=2 + i) for i in range(4)]
    base = Held()
    first = run_cycle(snapshot(nodes, [big, *longs], running, now=NOW), BEST_FIT, held=base)
    assert len(first.reservations) == 1
    assert base.state is not None and not base.state.reserved.any()
    later = snapshot(nodes, longs, running, now=NOW + 1)
    again = run_cycle(later, BEST_FIT, held=base)
    assert again == cycle(later)
    assert len(again.placements) == 4  # 8 free devices, none held


def test_a_reservation_is_found_on_the_devices_alone_without_charging_quota():
    from scheduler.core.backfill import reserve
    from scheduler.core.cycle import build_context

    nodes, running = cluster_half_busy()
    big = make_job("big", gpus=8, submitted_at=0)
    ctx = build_context(snapshot(nodes, [big], running, now=NOW), BEST_FIT)
    charges, free, mark = ctx.ledger.changes, ctx.state.whole_free.tolist(), ctx.mark()
    held = reserve(ctx, big, "H100", (0,))
    assert held is not None and held.start_at == 1600.0
    assert ctx.ledger.changes == charges  # the running jobs were released on the state only
    assert ctx.state.whole_free.tolist() == free and ctx.mark() == mark


def test_reclaim_waiting_for_min_runtime_expects_the_victims_remaining_min_runtime():
    # team-a's guarantee (16) admits its 8-GPU job; the only node runs team-b's borrowed job,
    # started at 760: reclaimable at 760 + 300 (min runtime) = 1060, i.e. in 1 min, not at its
    # natural end 760 + 86400 (unknown runtime), which said "expected in 1436 min".
    tenants = make_tenants(("team-a", 16, 16), ("team-b", 0, 16))
    victim = make_running(make_job("b1", "team-b", gpus=8), ("n1", range(8)), started_at=760)
    profile = replace(BEST_FIT, min_runtime_s=300.0)
    snap = snapshot([make_node("n1")], [make_job("a", gpus=8)], [victim], tenants=tenants)
    result = cycle(replace(snap, now=NOW), profile)
    assert [held.start_at for held in result.reservations] == [1060.0]
    reason = result.reason_for("a")
    # The reservation waits for a reclaim: the reason says so (issue 35), not "devices
    # reserved" alone.
    assert reason is not None and reason.message.endswith(
        "team-a reclaims its guarantee from team-b (8 H100 lent): preemption planned in 60 s, "
        "when its job leaves its minimum runtime; devices reserved for it"
    )
    assert reason.plan is not None and (reason.plan.at, reason.plan.victims) == (1060.0, ("b1",))


def test_reservation_waits_for_the_natural_end_of_a_job_it_may_not_preempt():
    # the same, but team-b runs within its own guarantee: no reclaim, so the reservation
    # waits for its end at 760 + 1200 = 1960, in 16 min
    tenants = make_tenants(("team-a", 16, 16), ("team-b", 8, 16))
    victim = make_running(
        make_job("b1", "team-b", gpus=8, runtime=1200), ("n1", range(8)), started_at=760
    )
    profile = replace(BEST_FIT, min_runtime_s=300.0)
    snap = snapshot([make_node("n1")], [make_job("a", gpus=8)], [victim], tenants=tenants)
    result = cycle(replace(snap, now=NOW), profile)
    assert [held.start_at for held in result.reservations] == [1960.0]


def test_a_short_estimate_cannot_jump_the_backfill():
    # One node; r ends at 400 + 1200 = 1600 and "big" holds all 8 devices from then.
    # "liar" says it needs 500 s (1000 + 500 <= 1600) but sets no max runtime, or a long
    # one: nothing would stop it at 500 s, so it may not start on the held devices.
    nodes = [make_node("n1")]
    running = [make_running(make_job("r", gpus=4, runtime=1200), ("n1", range(4)), started_at=400)]
    big = make_job("big", gpus=8)
    for liar in (
        replace(make_job("liar", gpus=2, submitted_at=5), estimated_runtime_s=500.0),
        replace(make_job("liar", gpus=2, runtime=5000, submitted_at=5), estimated_runtime_s=500.0),
    ):
        result = cycle(snapshot(nodes, [big, liar], running, now=NOW))
        assert result.placement_for("liar") is None
        reason = result.reason_for("liar")
        assert reason is not None and reason.code == WaitCode.RESERVATION
    # the same job with an enforced 500 s bound goes around the reservation
    honest = make_job("honest", gpus=2, runtime=500, submitted_at=5)
    assert cycle(snapshot(nodes, [big, honest], running, now=NOW)).placement_for("honest")


def test_a_running_jobs_estimate_does_not_move_the_reservation():
    # r1 and r2 estimate 100 s and set no max runtime: nothing stops them at 400 + 100 = 500,
    # so they count as running for the profile's unknown_runtime_s (400 + 86400 = 86800)
    nodes = [make_node("n1"), make_node("n2")]
    running = [
        make_running(
            replace(make_job(f"r{i}", gpus=4), estimated_runtime_s=100.0),
            (f"n{i}", range(4)),
            started_at=400,
        )
        for i in (1, 2)
    ]
    result = cycle(snapshot(nodes, [make_job("big", gpus=8)], running, now=NOW))
    assert result.reservations[0].start_at == 400 + BEST_FIT.unknown_runtime_s == 86800.0
