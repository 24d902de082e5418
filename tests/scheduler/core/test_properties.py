"""Properties over random clusters and queues: the promises of ARCHITECTURE.md.

Each example runs two cycles: the first turns random jobs into a valid running state (a
real cluster only ever holds what the engine placed), the second schedules a new random
queue against it, partly later in time so preemption and min runtime come into play.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import Profile, run_cycle
from scheduler.core.types import CycleResult, JobRequest, Quota, RunningJob, Snapshot, Tenant
from tests.scheduler.core.builders import BEST_FIT, CLASSES, GPU, make_job, make_node, make_tenants

pytestmark = pytest.mark.backend_independent(
    "the pure engine (import-linter): no database, cache or broker"
)

FLAVORS = ("H100", "A100")
TENANTS = ("team-a", "team-b", "team-c")
CLASS_NAMES = [c.name for c in CLASSES]
CLASS_OF = {c.name: c for c in CLASSES}


@st.composite
def jobs(draw: st.DrawFn, prefix: str, at: float) -> list[JobRequest]:
    out = []
    for i in range(draw(st.integers(0, 10))):
        share = draw(st.booleans()) and draw(st.booleans())
        gpus = draw(st.sampled_from([0.25, 0.5])) if share else draw(st.integers(1, 8))
        replicas = 1 if share else draw(st.integers(1, 3))
        elastic = replicas > 1 and draw(st.booleans())
        out.append(
            make_job(
                f"{prefix}{i}",
                draw(st.sampled_from(TENANTS)),
                gpus,
                replicas=replicas,
                priority=draw(st.sampled_from(CLASS_NAMES)),
                user=draw(st.sampled_from(["u1", "u2"])),
                gpu_memory_mib=draw(st.sampled_from([0, 20000, 60000])) if share else 0,
                flavors=draw(st.sampled_from([(), ("H100",), ("A100",)])),
                submitted_at=at + i,
                runtime=draw(st.sampled_from([None, 600.0, 7200.0])),
                min_replicas=1 if elastic else None,
                checkpointable=draw(st.booleans()),
            )
        )
    return out


@st.composite
def alike_jobs(draw: st.DrawFn, prefix: str, at: float) -> list[JobRequest]:
    """A queue whose jobs differ mostly in size: many share a team, user and class, as in
    a busy cluster, so that what one learns of another in a cycle is put to use."""
    return [
        make_job(
            f"{prefix}{i}",
            draw(st.sampled_from(TENANTS)),
            draw(st.integers(1, 8)),
            replicas=draw(st.integers(1, 2)),
            priority=draw(st.sampled_from(["low", "normal", "high"])),
            user="u1",
            submitted_at=at + i,
            runtime=draw(st.sampled_from([None, 600.0])),
        )
        for i in range(draw(st.integers(2, 14)))
    ]


@st.composite
def worlds(draw: st.DrawFn, queue=jobs) -> tuple[Snapshot, Snapshot]:
    nodes = [
        make_node(
            f"n{i}",
            draw(st.sampled_from([2, 4, 8])),
            draw(st.sampled_from(FLAVORS)),
            domain=f"d{i // 2}",
            rack=f"r{i // 4}",
            healthy=draw(st.booleans()) or i == 0,
        )
        for i in range(draw(st.integers(1, 4)))
    ]
    teams = [(t, draw(st.integers(0, 8)), draw(st.sampled_from([None, 4, 12]))) for t in TENANTS]
    tenants = [*make_tenants(*teams, flavor="H100")]
    tenants = [
        replace(t, quotas={**t.quotas, **make_tenants(*teams, flavor="A100")[k].quotas})
        for k, t in enumerate(tenants)
    ]
    if draw(st.booleans()):  # team-a and team-b inside a department, which may have a limit
        g = (teams[0][1] + teams[1][1]) * GPU
        limit = draw(st.sampled_from([None, g, g + 4 * GPU]))
        dept = Tenant("dept", "org", {f: Quota(g, limit) for f in FLAVORS})
        tenants = [replace(t, parent="dept") if t.name in TENANTS[:2] else t for t in tenants]
        tenants.append(dept)
    first = Snapshot(0.0, tuple(nodes), tuple(tenants), CLASSES, (), tuple(draw(jobs("r", 0.0))))
    result = run_cycle(first, BEST_FIT)
    by_id = {j.id: j for j in first.pending}
    running = tuple(
        RunningJob(by_id[p.job_id], p.flavor, p.assignments, draw(st.sampled_from([0.0, 900.0])))
        for p in result.placements
    )
    second = replace(first, now=1000.0, running=running, pending=tuple(draw(queue("p", 500.0))))
    return first, second


def held_after(snap: Snapshot, result: CycleResult) -> list[tuple[JobRequest, str, list]]:
    """(job, flavor, assignments) of everything running once the decisions are applied."""
    stopped = {(p.job_id, r) for p in result.preemptions for r in p.replicas}
    out = [
        (r.job, r.flavor, [a for a in r.assignments if (r.job.id, a.replica) not in stopped])
        for r in snap.running
    ]
    pending = {j.id: j for j in snap.pending} | {r.job.id: r.job for r in snap.running}
    out += [(pending[p.job_id], p.flavor, list(p.assignments)) for p in result.placements]
    return out


def check_promises(snap: Snapshot, result: CycleResult) -> None:
    nodes = {n.name: n for n in snap.nodes}
    held = held_after(snap, result)
    milli: dict[tuple[str, int], int] = defaultdict(int)
    memory: dict[tuple[str, int], int] = defaultdict(int)
    for job, flavor, assignments in held:
        for a in assignments:
            assert nodes[a.node].flavor == flavor
            # every replica got exactly what it asked for
            assert a.gpu_milli == job.resources.gpu_milli
            assert len(a.shares) == max(job.resources.whole_gpus, job.resources.is_shared)
            for s in a.shares:
                milli[(a.node, s.device)] += s.milli
                memory[(a.node, s.device)] += s.memory_mib
    # no device over-allocated, in GPU or in GPU memory
    assert all(v <= GPU for v in milli.values()), milli
    for (node, device), used in memory.items():
        assert used <= nodes[node].devices[device].memory_mib
    # gangs whole or absent; new placements only on healthy nodes
    for p in result.placements:
        job = next((j for j in snap.pending if j.id == p.job_id), None)
        if job is not None:
            assert {a.replica for a in p.assignments} >= set(range(job.gang_size))
        assert all(nodes[a.node].healthy for a in p.assignments)
    check_quota(snap, held)
    check_victims(snap, result, held)


def check_quota(snap: Snapshot, held: list[tuple[JobRequest, str, list]]) -> None:
    usage: dict[tuple[str, str], int] = defaultdict(int)
    for job, flavor, assignments in held:
        if CLASS_OF[job.priority_class].counts_against_quota:
            usage[(job.tenant, flavor)] += sum(a.gpu_milli for a in assignments)
    usage, before = subtree(snap, usage), subtree(snap, quota_usage(snap))
    parents = {t.name: t.parent for t in snap.tenants}
    for flavor in FLAVORS:
        g = {t.name: t.quotas[flavor].guaranteed for t in snap.tenants if flavor in t.quotas}
        for t in snap.tenants:
            quota = t.quotas.get(flavor)
            # no tenant (or subtree) over its limit, unless it already was before the cycle
            if quota is not None and quota.limit is not None:
                assert usage[(t.name, flavor)] <= max(quota.limit, before[(t.name, flavor)])
        # usage beyond guarantee only from idle guarantee of siblings, or borrowed by the
        # parent from further up
        for parent in {p for p in parents.values() if p is not None}:
            kids = [k for k, p in parents.items() if p == parent and k in g]
            borrowed = sum(max(0, usage[(k, flavor)] - g[k]) for k in kids)
            idle = sum(max(0, g[k] - usage[(k, flavor)]) for k in kids)
            lent_from_above = max(0, usage[(parent, flavor)] - g[parent]) if parent in g else 0
            if parents.get(parent) is None:
                lent_from_above = 0  # the root has nobody to borrow from
            assert borrowed <= idle + lent_from_above


def subtree(snap: Snapshot, usage: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """Usage of each tenant's subtree, from usage by the tenants' own jobs."""
    parents = {t.name: t.parent for t in snap.tenants}
    out: dict[tuple[str, str], int] = defaultdict(int)
    for (tenant, flavor), milli in usage.items():
        node: str | None = tenant
        while node is not None:
            out[(node, flavor)] += milli
            node = parents.get(node)
    return out


def quota_usage(snap: Snapshot) -> dict[tuple[str, str], int]:
    usage: dict[tuple[str, str], int] = defaultdict(int)
    for r in snap.running:
        if CLASS_OF[r.job.priority_class].counts_against_quota:
            usage[(r.job.tenant, r.flavor)] += r.gpu_milli
    return usage


def check_victims(snap: Snapshot, result: CycleResult, held: list) -> None:
    """A victim of another tenant must belong to one that borrowed: before the cycle, or
    once this cycle's admissions are counted (the victim still included), since a tenant
    that borrows idle guarantee early in a cycle can be reclaimed from later in it."""
    before = quota_usage(snap)
    peak = defaultdict(int, before)
    for job, flavor, assignments in held:
        if CLASS_OF[job.priority_class].counts_against_quota and job.id not in {
            r.job.id for r in snap.running
        }:
            peak[(job.tenant, flavor)] += sum(a.gpu_milli for a in assignments)
    guarantee = {(t.name, f): q.guaranteed for t in snap.tenants for f, q in t.quotas.items()}
    running = {r.job.id: r for r in snap.running}
    jobs = {j.id: j for j in snap.pending}
    for p in result.preemptions:
        victim = running[p.job_id]
        preemptor = jobs[p.preemptor]
        v_class, p_class = CLASS_OF[victim.job.priority_class], CLASS_OF[preemptor.priority_class]
        extras_only = not p.whole_job
        lower_same_tenant = victim.job.tenant == preemptor.tenant and v_class.value < p_class.value
        key = (victim.job.tenant, victim.flavor)
        reclaim = victim.job.tenant != preemptor.tenant and peak[key] > guarantee.get(key, 0)
        assert extras_only or not v_class.counts_against_quota or lower_same_tenant or reclaim, p
        assert v_class.preemptible or extras_only
        assert p_class.may_preempt and p_class.counts_against_quota


PROFILES = [BEST_FIT, Profile(min_runtime_s=300.0)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=worlds(), profile=st.sampled_from(PROFILES))
def test_promises_hold_after_any_cycle(world, profile):
    first, second = world
    check_promises(first, run_cycle(first, profile))
    check_promises(second, run_cycle(second, profile))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=worlds())
def test_run_cycle_is_deterministic(world):
    _, second = world
    profile = Profile(min_runtime_s=300.0)
    assert run_cycle(second, profile) == run_cycle(second, profile)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=worlds(), profile=st.sampled_from(PROFILES))
def test_preemption_precheck_changes_no_decision(world, profile):
    """`may_make_room` only skips searches that could not succeed: the same cycle without
    it decides exactly the same."""
    from scheduler.core import preemption

    _, second = world
    with_check = run_cycle(second, profile)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(preemption, "may_make_room", lambda *args: True)
        without = run_cycle(second, profile)
    assert with_check == without


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=st.one_of(worlds(), worlds(alike_jobs)), profile=st.sampled_from(PROFILES))
def test_quota_floors_change_no_decision(world, profile):
    """A request told its quota reason by a floor (`cycle._Decisions.floors`) without a
    victim search is decided as the search would have: the same cycle without floors
    decides exactly the same, reasons included."""
    from scheduler.core import cycle as engine

    first, second = world
    for snap in (first, second):
        with_floors = run_cycle(snap, profile)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(engine, "_floor_key", lambda *args: None)
            without = run_cycle(snap, profile)
        assert with_floors == without


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=worlds(), profile=st.sampled_from(PROFILES), data=st.data())
def test_a_held_base_changes_no_decision(world, profile, data):
    """The base a daemon keeps between cycles (`Held`) gives the same decisions as a state
    built afresh, cycle after cycle, as jobs start, end and shrink under it."""
    from scheduler.core.context import Held

    first, second = world
    held = Held()
    assert run_cycle(first, profile, held=held) == run_cycle(first, profile)
    result = run_cycle(second, profile, held=held)
    assert result == run_cycle(second, profile)
    # Next: some of what ran ended, the rest runs on (a gang may have lost a replica), and
    # this cycle's placements started.
    by_id = {j.id: j for j in second.pending}
    running = [
        replace(r, assignments=r.assignments[: data.draw(st.integers(1, len(r.assignments)))])
        for r in second.running
        if data.draw(st.booleans())
    ]
    running += [RunningJob(by_id[p.job_id], p.flavor, p.assignments, 1000.0, started=False)
                for p in result.placements if p.job_id in by_id]  # fmt: skip
    third = replace(
        second, now=2000.0, running=tuple(running), pending=tuple(data.draw(jobs("q", 1500.0)))
    )
    assert run_cycle(third, profile, held=held) == run_cycle(third, profile)
    # and the same snapshot again, the base unchanged by the cycle's trials
    assert run_cycle(third, profile, held=held) == run_cycle(third, profile)
    # Then the placed pods started: the same holds, new objects.
    fourth = replace(
        third,
        now=2100.0,
        running=tuple(
            replace(r, started=True, started_at=2050.0) if not r.started else r
            for r in third.running
        ),
    )
    assert run_cycle(fourth, profile, held=held) == run_cycle(fourth, profile)
