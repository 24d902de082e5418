"""A job waiting for room holds it against the jobs it could preempt
(``Profile.hold_for_higher_priority``): a lower-priority job of its team, or a borrower it
would reclaim from, is not started in the room it waits for, only to be preempted for it once
it fits. Kueue's scenario through the Kubernetes-native path admitted such jobs and preempted
them seconds later, hundreds of times a run (issue 37)."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core.types import Quota, Tenant
from tests.scheduler.core.builders import (
    BEST_FIT,
    cycle,
    make_job,
    make_node,
    make_running,
    make_tenants,
    snapshot,
    victims,
)

NOW = 1000.0
# The running jobs below started at 900: inside the minimum runtime, so nothing is preempted
# in these cycles and the waiting job waits for quota.
PROFILE = replace(BEST_FIT, min_runtime_s=300.0, wait_for_cheaper_s=0.0)
OFF = replace(PROFILE, hold_for_higher_priority=False)


def _team_at_its_limit(pending):
    """team-a (limit 8) runs six 1-GPU low-priority jobs on n1 (two of its 8 GPUs free)."""
    running = [
        make_running(make_job(f"low-{d}", gpus=1, priority="low"), ("n1", [d]), started_at=900)
        for d in range(6)
    ]
    tenants = make_tenants(("team-a", 8, 8), ("team-b", 8, None))
    return snapshot([make_node("n1"), make_node("n2")], pending, running, tenants=tenants, now=NOW)


def test_a_lower_priority_job_of_the_team_waits_behind_one_waiting_for_the_teams_quota():
    """A 5-GPU normal job finds 2 of its team's 8 free and its team's low jobs inside their
    minimum runtime: it waits. A 1-GPU low job of the team would fit, and the normal job could
    preempt it: it waits too, saying why, and the two GPUs stay for the normal job."""
    pending = [
        make_job("normal", gpus=5, priority="normal", submitted_at=1),
        make_job("late-low", gpus=1, priority="low", submitted_at=2),
    ]
    result = cycle(_team_at_its_limit(pending), PROFILE)
    assert result.placement_for("normal") is None
    assert result.placement_for("late-low") is None
    reason = result.reason_for("late-low")
    assert reason is not None and "waiting behind a job of higher priority in its team" in (
        reason.message
    )
    assert not victims(result)


def test_without_the_hold_the_lower_job_takes_the_room_the_higher_one_waits_for():
    pending = [
        make_job("normal", gpus=5, priority="normal", submitted_at=1),
        make_job("late-low", gpus=1, priority="low", submitted_at=2),
    ]
    result = cycle(_team_at_its_limit(pending), OFF)
    assert result.placement_for("normal") is None
    assert result.placement_for("late-low") is not None


def test_a_gang_larger_than_its_teams_guarantee_holds_nothing():
    """A 3 x 8 gang of the team (guarantee 8) needs what others lend, which may not come for
    long: the low job behind it is not kept from room the gang could not have."""
    pending = [
        make_job("gang", gpus=8, replicas=3, priority="normal", submitted_at=1),
        make_job("late-low", gpus=1, priority="low", submitted_at=2),
    ]
    result = cycle(_team_at_its_limit(pending), PROFILE)
    assert result.placement_for("gang") is None
    assert result.placement_for("late-low") is not None


def test_a_job_of_equal_priority_or_of_another_team_within_its_guarantee_is_not_held():
    pending = [
        make_job("normal", gpus=5, priority="normal", submitted_at=1),
        make_job("other-normal", gpus=1, priority="normal", submitted_at=2),
        make_job("team-b", "team-b", gpus=1, priority="low", submitted_at=3),
    ]
    result = cycle(_team_at_its_limit(pending), PROFILE)
    assert result.placement_for("normal") is None
    assert result.placement_for("other-normal") is not None
    assert result.placement_for("team-b") is not None


def test_a_borrower_waits_behind_a_team_reclaiming_its_guarantee():
    """The cohort holds 16 and 15 are in use: team-b borrows 3 beyond its 8, team-a runs 4 of
    its 8. team-a's 4-GPU job is owed its guarantee, but team-b's jobs are inside their
    minimum runtime: it waits. team-b's next 1-GPU job would borrow the last GPU, to be
    reclaimed once team-a's job may preempt: it waits too, the other team not named."""
    tenants = (
        Tenant("org", None, {"H100": Quota(16_000, 16_000)}),
        Tenant("team-a", "org", {"H100": Quota(8_000, 16_000)}),
        Tenant("team-b", "org", {"H100": Quota(8_000, 16_000)}),
    )
    running = [
        make_running(make_job("a-run", gpus=4), ("n1", range(4)), started_at=900),
        make_running(make_job("b-run", "team-b", gpus=8), ("n2", range(8)), started_at=900),
        make_running(make_job("b-run2", "team-b", gpus=3), ("n3", range(3)), started_at=900),
    ]
    pending = [
        make_job("a-owed", gpus=4, submitted_at=1),
        make_job("b-next", "team-b", gpus=1, submitted_at=2),
    ]
    nodes = [make_node("n1"), make_node("n2"), make_node("n3")]
    snap = snapshot(nodes, pending, running, tenants=tenants, now=NOW)
    result = cycle(snap, PROFILE)
    assert result.placement_for("a-owed") is None
    assert result.placement_for("b-next") is None
    reason = result.reason_for("b-next")
    assert reason is not None and "a team reclaiming its guarantee" in reason.message
    assert "team-a" not in reason.message
    assert cycle(snap, OFF).placement_for("b-next") is not None


def test_a_lower_priority_job_waits_behind_one_of_its_team_waiting_for_devices():
    """The team's quota is ample (64), its node full but two GPUs: a 5-GPU normal job waits
    for devices (its team's low jobs inside their minimum runtime; no backfill reservation
    here), and the team's next 1-GPU low job is kept from the two GPUs it waits beside."""
    running = [
        make_running(make_job(f"low-{d}", gpus=1, priority="low"), ("n1", [d]), started_at=900)
        for d in range(6)
    ]
    pending = [
        make_job("normal", gpus=5, priority="normal", submitted_at=1),
        make_job("late-low", gpus=1, priority="low", submitted_at=2),
    ]
    snap = snapshot([make_node("n1")], pending, running, now=NOW)
    no_backfill = replace(PROFILE, backfill=False)
    result = cycle(snap, no_backfill)
    assert result.placement_for("normal") is None
    assert result.placement_for("late-low") is None
    without = cycle(snap, replace(no_backfill, hold_for_higher_priority=False))
    assert without.placement_for("late-low") is not None
