"""Quotas pinned to a cluster in the engine (``scheduler.core.pinned``): a pinned limit keeps
a tenant's use of the flavor on that cluster's nodes within it; a job that needs its tenant's
pinned guarantee is placed only in that cluster, and reclaims there from any tenant that uses
the cluster beyond its own pinned guarantee; borrowing and fair share count every cluster."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.clusters import CLUSTER_LABEL
from scheduler.core.quota import QuotaLedger, implied_global, pinned_key
from scheduler.core.types import CycleResult, JobRequest, Node, Quota, RunningJob, Tenant
from tests.scheduler.core.builders import (
    GPU,
    cycle,
    make_job,
    make_node,
    make_running,
    placed_nodes,
    snapshot,
    victims,
)


def node(name: str, gpus: int = 8) -> Node:
    """``a:1`` is a node of cluster ``a``."""
    return replace(make_node(name, gpus), labels={CLUSTER_LABEL: name.split(":")[0]})


def team(
    name: str,
    guaranteed: float | None = None,
    limit: float | None = None,
    *,
    pins: dict[str, tuple[float, float | None]] | None = None,
) -> Tenant:
    """A team under ``org``: a global quota of H100 (none when ``guaranteed`` is None) and
    quotas pinned per cluster, ``{cluster: (guaranteed, limit)}``, in GPUs."""
    quotas = {}
    if guaranteed is not None:
        quotas["H100"] = Quota(
            round(guaranteed * GPU), None if limit is None else round(limit * GPU)
        )
    pinned = {
        pinned_key("H100", c): Quota(round(g * GPU), None if lim is None else round(lim * GPU))
        for c, (g, lim) in (pins or {}).items()
    }
    return Tenant(name, "org", quotas, pinned=pinned)


def clusters_of(result: CycleResult, job_id: str) -> set[str]:
    return {n.split(":")[0] for n in placed_nodes(result, job_id)}


TWO = [node("a:1"), node("b:1")]  # a:1 first: best fit's tie goes to it


def test_a_pinned_limit_keeps_the_tenant_off_that_cluster_once_reached() -> None:
    tenants = (Tenant("org"), team("team-a", 16, 16, pins={"a": (0, 2)}), team("team-b", 16))
    held = make_running(make_job("held", gpus=2), ("a:1", range(2)))
    result = cycle(snapshot(TWO, [make_job("j")], [held], tenants=tenants))
    # a:1 is the better fit (6 free of 8 against 8), but 2 + 1 > the pinned limit of 2 on a
    assert clusters_of(result, "j") == {"b"}


def test_pinned_limits_that_bar_every_cluster_make_the_job_wait_on_quota_saying_where() -> None:
    tenants = (
        Tenant("org"),
        team("team-a", 16, 16, pins={"a": (0, 2), "b": (0, 1)}),
        team("team-b", 16),
    )
    held = [
        make_running(make_job("h1", gpus=2), ("a:1", range(2))),
        make_running(make_job("h2", gpus=1), ("b:1", range(1))),
    ]
    result = cycle(snapshot(TWO, [make_job("j")], held, tenants=tenants))
    reason = result.reason_for("j")
    assert result.placement_for("j") is None and reason is not None
    assert reason.code == "quota"
    assert "has 2 of its H100 limit of 2 on cluster a in use; this job needs 1" in reason.message
    assert "has 1 of its H100 limit of 1 on cluster b in use" in reason.message


def test_a_job_the_cluster_is_required_for_waits_on_the_pinned_limit_there() -> None:
    tenants = (Tenant("org"), team("team-a", 16, 16, pins={"a": (0, 2)}), team("team-b", 16))
    held = make_running(make_job("held", gpus=2), ("a:1", range(2)))
    job = replace(make_job("j"), clusters=("a",))
    result = cycle(snapshot(TWO, [job], [held], tenants=tenants))
    reason = result.reason_for("j")
    assert reason is not None and reason.code == "quota" and "cluster a" in reason.message


@pytest.mark.parametrize(
    ("team_a", "running", "expected"),
    [
        # no pin: best fit takes a:1
        (team("team-a", 4, 16), [], {"a"}),
        # the whole guarantee is pinned to b (and implied globally): the job needs it
        (team("team-a", pins={"b": (4, 16)}), [], {"b"}),
        # 8 guaranteed, 4 of them pinned to b: the 4 that float go anywhere first
        (team("team-a", 8, 16, pins={"b": (4, 16)}), [], {"a"}),
        # ... and once 4 float on a, the next job needs b's pinned part
        (team("team-a", 8, 16, pins={"b": (4, 16)}), [("a:1", 4)], {"b"}),
        # 4 pinned to b and used: the next job borrows, anywhere (a:1, 2 free, fits best)
        (team("team-a", pins={"b": (4, 16)}), [("b:1", 4), ("a:1", 6, "team-b")], {"a"}),
    ],
    ids=["global", "all-pinned", "floating-first", "then-pinned", "borrowing-anywhere"],
)
def test_a_job_that_needs_its_pinned_guarantee_runs_only_in_that_cluster(
    team_a: Tenant, running: list[tuple[str, int] | tuple[str, int, str]], expected: set[str]
) -> None:
    tenants = (Tenant("org"), team_a, team("team-b", 16))
    held = [
        make_running(make_job(f"h{i}", (*held, "team-a")[2], gpus), (held[0], range(gpus)))
        for i, held in enumerate(running)
        if (gpus := held[1])
    ]
    result = cycle(snapshot(TWO, [make_job("j")], held, tenants=tenants))
    assert clusters_of(result, "j") == expected


def test_a_pinned_guarantee_reclaims_its_cluster_from_a_tenant_within_its_global_one() -> None:
    # team-b is within its global guarantee (8 of 8) but uses a, where it pins nothing:
    # team-a's guarantee is pinned to a. b's job on b:1 started last (the cheapest victim)
    # but frees no room on a: it keeps running.
    tenants = (Tenant("org"), team("team-a", pins={"a": (8, 8)}), team("team-b", 8, 16))
    running = [
        make_running(make_job("b-on-a", "team-b", gpus=8), ("a:1", range(8)), started_at=0.0),
    ]
    result = cycle(snapshot(TWO, [make_job("j", gpus=8)], running, tenants=tenants))
    assert victims(result) == {"b-on-a"}
    assert clusters_of(result, "j") == {"a"}


def test_no_reclaim_from_a_tenant_within_its_pinned_guarantee_there() -> None:
    tenants = (
        Tenant("org"),
        team("team-a", pins={"a": (8, 8)}),
        team("team-b", pins={"a": (8, 8)}),
    )
    nodes = [node("a:1"), node("a:2")]
    running = [
        make_running(make_job(f"b{i}", "team-b", gpus=4), (f"a:{i + 1}", range(4)))
        for i in range(2)
    ]
    # team-a asks 8 on a: a:1 and a:2 each have 4 free; b is within its pinned 8 on a
    result = cycle(snapshot(nodes, [make_job("j", gpus=8)], running, tenants=tenants))
    assert result.placement_for("j") is None
    assert victims(result) == set()


def test_a_reclaim_stops_a_borrower_in_another_cluster_only_when_that_frees_quota() -> None:
    # Global quotas: team-a 4, team-b 4 (the cohort holds 8). team-b runs 4 on a (within its
    # guarantee, started first) and 4 on b (borrowing, started last). team-a's 4 fit on a:1
    # as it is, but quota is short (8 + 4 > 8): the borrower's job on b gives the quota back,
    # though team-a lands on a.
    tenants = (Tenant("org"), team("team-a", 4, 16), team("team-b", 4, 16))
    running = [
        make_running(make_job("b-a", "team-b", gpus=4), ("a:1", range(4)), started_at=0.0),
        make_running(make_job("b-b", "team-b", gpus=4), ("b:1", range(4)), started_at=500.0),
    ]
    result = cycle(snapshot(TWO, [make_job("j", gpus=4)], running, tenants=tenants))
    assert victims(result) == {"b-b"}
    assert clusters_of(result, "j") == {"a"}


def test_a_job_that_fits_its_pinned_limit_only_once_a_victim_stops_waits_for_it() -> None:
    # team-a may hold 4 on a. "low" holds them; "high" (2) preempts it; "next" (2) then fits
    # the limit (2 + 2), but only once "low" stopped: 4 + 2 + 2 > 4 while it runs.
    tenants = (Tenant("org"), team("team-a", 16, 16, pins={"a": (0, 4)}), team("team-b", 16))
    low = make_running(make_job("low", gpus=4, priority="low"), ("a:1", range(4)))
    pending = [
        replace(make_job("high", gpus=2, priority="high"), clusters=("a",)),
        replace(make_job("next", gpus=2, submitted_at=1.0), clusters=("a",)),
    ]
    result = cycle(snapshot(TWO, pending, [low], tenants=tenants))
    assert victims(result) == {"low"}
    placed = result.placement_for("next")
    assert placed is not None and placed.victims == ("low",)


def test_fair_share_and_the_global_limit_count_every_cluster() -> None:
    # 2 on a and 2 on b: 4 of the global limit of 4, whatever the cluster
    tenants = (Tenant("org"), team("team-a", 2, 4, pins={"a": (1, 4)}), team("team-b", 16))
    running = [
        make_running(make_job("h1", gpus=2), ("a:1", range(2))),
        make_running(make_job("h2", gpus=2), ("b:1", range(2))),
    ]
    result = cycle(snapshot(TWO, [make_job("j")], running, tenants=tenants))
    reason = result.reason_for("j")
    assert reason is not None and reason.code == "quota" and "limit of 4" in reason.message


def test_a_tenant_that_only_pins_holds_their_sums_globally() -> None:
    pins = {
        pinned_key("H100", "a"): Quota(2 * GPU, 4 * GPU),
        pinned_key("H100", "b"): Quota(GPU, GPU),
    }
    assert implied_global(pins, "H100") == Quota(3 * GPU, 5 * GPU)
    assert implied_global(pins, "A100") is None
    ledger = QuotaLedger((Tenant("org"), Tenant("t", "org", pinned=pins)), ["H100"])
    assert ledger.guarantee("t", "H100") == 3 * GPU
    assert ledger.guarantee("t", pinned_key("H100", "a")) == 2 * GPU


# -- properties over random two-cluster worlds ----------------------------------------------


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[Node], tuple[Tenant, ...], list[JobRequest]]:
    """Two clusters of 1-3 nodes of 2-8 GPUs; teams with random pinned quotas on either
    cluster (limits at least their guarantees, pinned guarantees of a cluster within its
    GPUs) under a global quota that holds them; 1-GPU and 2-GPU jobs of every team."""
    nodes: list[Node] = []
    size: dict[str, int] = {}
    for c in ("a", "b"):
        gpus = draw(st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=3))
        nodes += [node(f"{c}:{i}", g) for i, g in enumerate(gpus)]
        size[c] = sum(gpus)
    left = dict(size)
    tenants: list[Tenant] = [Tenant("org")]
    for name in ("t1", "t2", "t3"):
        pins: dict[str, tuple[float, float | None]] = {}
        for c in ("a", "b"):
            if draw(st.booleans()):
                g = draw(st.integers(0, left[c]))
                left[c] -= g
                pins[c] = (g, draw(st.integers(g, size[c])))
        floating = draw(st.integers(0, 4))
        guaranteed = sum(g for g, _ in pins.values()) + floating
        tenants.append(team(name, guaranteed, guaranteed + draw(st.integers(0, 8)), pins=pins))
    jobs = [
        make_job(f"j{i}", draw(st.sampled_from(["t1", "t2", "t3"])), draw(st.sampled_from([1, 2])))
        for i in range(draw(st.integers(1, 24)))
    ]
    return nodes, tuple(tenants), jobs


def use_per_cluster(running: list[RunningJob]) -> dict[tuple[str, str], int]:
    used: dict[tuple[str, str], int] = defaultdict(int)
    for r in running:
        for a in r.assignments:
            used[(r.job.tenant, a.node.split(":")[0])] += a.gpu_milli
    return used


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=worlds())
def test_no_tenant_ever_uses_a_cluster_beyond_its_pinned_limit_there(
    world: tuple[list[Node], tuple[Tenant, ...], list[JobRequest]],
) -> None:
    nodes, tenants, jobs = world
    by_id = {j.id: j for j in jobs}
    running: list[RunningJob] = []
    half = len(jobs) // 2
    for pending in (jobs[:half], jobs[half:]):  # a second cycle over what the first placed
        result = cycle(snapshot(nodes, pending, running, tenants=tenants))
        stopped = victims(result)
        running = [r for r in running if r.job.id not in stopped] + [
            RunningJob(by_id[p.job_id], p.flavor, p.assignments, 0.0) for p in result.placements
        ]
        used = use_per_cluster(running)
        for t in tenants:
            for key, quota in t.pinned.items():
                cluster = key.split("@")[1]
                assert quota.limit is not None
                assert used[(t.name, cluster)] <= quota.limit, (t.name, cluster)


def settle(
    nodes: list[Node],
    tenants: tuple[Tenant, ...],
    pending: list[JobRequest],
    running: list[RunningJob],
) -> tuple[list[RunningJob], list[str]]:
    """Cycles until nothing changes (at most 6): the victims stop, the placements start,
    the teams' stopped jobs queue again (the filler's do not). What runs and what the
    last cycle left waiting."""
    by_id = {j.id: j for j in pending} | {r.job.id: r.job for r in running}
    for _ in range(6):
        result = cycle(snapshot(nodes, pending, running, tenants=tenants))
        stopped = victims(result)
        if not result.placements and not stopped:
            break
        running = [r for r in running if r.job.id not in stopped] + [
            RunningJob(by_id[p.job_id], p.flavor, p.assignments, 1000.0, displaced=p.victims)
            for p in result.placements
        ]
        placed = {p.job_id for p in result.placements}
        pending = [j for j in pending if j.id not in placed] + [
            by_id[v] for v in sorted(stopped) if by_id[v].tenant != "filler"
        ]
    return running, [j.id for j in pending]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=worlds())
def test_pinned_guarantees_are_honoured_per_cluster(
    world: tuple[list[Node], tuple[Tenant, ...], list[JobRequest]],
) -> None:
    """A filler team takes every GPU, within its global guarantee (the GPUs no team pins)
    and beyond; then each team asks as many 1-GPU jobs as its pinned guarantees hold. Once
    the cycles settle, every such job runs (only the filler, or a team on a cluster beyond its
    own pinned guarantee there, gave way), and on each cluster a team runs at least its
    pinned guarantee there less the part of its global guarantee that floats (which its
    jobs take wherever they fit best)."""
    nodes, tenants, _ = world
    total = sum(len(n.devices) for n in nodes)
    pinned_sum = sum(q.guaranteed for t in tenants for q in t.pinned.values())
    filler = Tenant("filler", "org", {"H100": Quota(total * GPU - pinned_sum, None)})
    tenants = (*tenants, filler)
    fill = [make_job(f"f{i}", "filler", 1, priority="low") for i in range(total)]
    running, _ = settle(nodes, tenants, fill, [])
    asks = [
        make_job(f"{t.name}-{i}", t.name, 1)
        for t in tenants
        for i in range(sum(q.guaranteed for q in t.pinned.values()) // GPU)
    ]
    running, waiting = settle(nodes, tenants, asks, running)
    assert waiting == []
    used = use_per_cluster([r for r in running if r.job.tenant != "filler"])
    for t in tenants:
        if not t.pinned:
            continue
        floating = t.quotas["H100"].guaranteed - sum(q.guaranteed for q in t.pinned.values())
        for key, quota in t.pinned.items():
            cluster = key.split("@")[1]
            assert used[(t.name, cluster)] >= quota.guaranteed - floating, (t, cluster)
