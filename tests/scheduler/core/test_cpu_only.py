"""Jobs without GPUs on GPU nodes (issue 34, item 17): together they hold at most the
profile's ``cpu_only_share`` of a GPU node's CPU and memory, so they cannot strand its GPUs.

Three CPU-only jobs of a team without quota on L40S and T4 took most of the CPU and memory
of two L40S nodes and a T4 node; another team's 8 x L40S job then waited while 24 GPUs
stood unusable."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import Profile, run_cycle
from scheduler.core.context import Held
from scheduler.core.types import Quota, Tenant, WaitCode
from tests.scheduler.core.builders import (
    BEST_FIT,
    GPU,
    cycle,
    make_job,
    make_node,
    make_running,
    snapshot,
)

pytestmark = pytest.mark.backend_independent(
    "the pure engine (import-linter): no database, cache or broker"
)

# A team with quota on H100 only (none on L40S or T4) and one with 16 L40S.
TENANTS = (
    Tenant("org"),
    Tenant("cpu-team", "org", {"H100": Quota(8 * GPU)}),
    Tenant("vision", "org", {"L40S": Quota(16 * GPU), "T4": Quota(8 * GPU)}),
)
# Two 8 x L40S nodes and an 8 x T4 node: 128 cores and 1 TiB each, 24 GPUs.
NODES = [
    make_node("l40s-1", 8, "L40S"),
    make_node("l40s-2", 8, "L40S"),
    make_node("t4-1", 8, "T4"),
]
GIB = 1024


def cpu_job(job_id: str, cores: int, gib: int, **kw: object) -> object:
    return make_job(job_id, "cpu-team", 0, cpu=cores * 1000, memory=gib * GIB, **kw)


# The 8 x L40S job asks 7/8 of a node: 112 of 128 cores, 896 of 1024 GiB.
BIG = make_job("big", "vision", 8, cpu=112_000, memory=896 * GIB, flavors=["L40S"])

# (id, profile's share, CPU-only jobs pending (first, as "high"), running CPU-only jobs,
#  CPU-only jobs expected placed, code of those left waiting, whether BIG is placed)
CASES = [
    # The issue: 100 cores and 900 GiB each are far beyond 1/8 of a node (16 cores, 128
    # GiB): no GPU node may hold them, so they wait, and the 8 x L40S job starts.
    (
        "issue-three-big-cpu-jobs-wait-8xL40S-starts",
        0.125,
        [cpu_job(f"c{i}", 100, 900, priority="high") for i in range(3)],
        [],
        set(),
        WaitCode.NO_MATCHING_NODE,
        True,
    ),
    # Without the share kept (1: the former behaviour) they take a node each and the
    # 8 x L40S job finds no node with 112 cores free: 128 - 100 = 28.
    (
        "share-1-strands-the-gpus",
        1.0,
        [cpu_job(f"c{i}", 100, 900, priority="high") for i in range(3)],
        [],
        {"c0", "c1", "c2"},
        None,
        False,
    ),
    # Within the share they run: 8 cores and 64 GiB each, two per node at most (16 cores,
    # 128 GiB), and the 8 x L40S job still has its 112 cores and 896 GiB on either node.
    (
        "small-cpu-jobs-within-the-share",
        0.125,
        [cpu_job(f"c{i}", 8, 64, priority="high") for i in range(6)],
        [],
        {f"c{i}" for i in range(6)},
        None,
        True,
    ),
    # Running CPU-only jobs already hold 16 cores on every node: one more waits, told why.
    (
        "share-full-next-waits",
        0.125,
        [cpu_job("more", 1, 1, priority="high")],
        [("r-l1", "l40s-1"), ("r-l2", "l40s-2"), ("r-t4", "t4-1")],
        set(),
        WaitCode.CAPACITY,
        True,
    ),
]


@pytest.mark.parametrize(
    ("share", "cpu_jobs", "running", "placed", "code", "big_placed"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_cpu_only_jobs_cannot_strand_gpus(share, cpu_jobs, running, placed, code, big_placed):
    profile = replace(BEST_FIT, cpu_only_share=share)
    held = [make_running(cpu_job(r, 16, 128), (node, []), flavor="") for r, node in running]
    result = cycle(snapshot(NODES, [*cpu_jobs, BIG], held, tenants=TENANTS), profile)
    assert {p.job_id for p in result.placements} - {"big"} == placed
    for job in cpu_jobs:
        if job.id not in placed:
            reason = result.reason_for(job.id)
            assert reason is not None and reason.code == code, reason
    assert (result.placement_for("big") is not None) == big_placed, result.reason_for("big")


def test_the_wait_reason_names_the_share_kept_for_gpu_jobs():
    result = cycle(snapshot(NODES, [cpu_job("c", 100, 900)], tenants=TENANTS))
    reason = result.reason_for("c")
    assert reason is not None
    # 1/8 of 128 cores: 16 cores
    assert reason.message == (
        "nothing in the cluster can hold this job today: no L40S or T4 node has 100000 mCPU "
        "for jobs without GPUs (the rest is kept for GPU jobs); the most is 16000"
    )


def test_a_node_without_gpus_is_not_limited():
    # the share binds nodes with GPUs only: a node without any keeps its whole CPU
    state_nodes = [make_node("cpu", 0, "L40S"), make_node("gpu", 8, "L40S")]
    result = cycle(snapshot(state_nodes, [cpu_job("c", 100, 900)], tenants=TENANTS))
    placement = result.placement_for("c")
    assert placement is not None and placement.assignments[0].node == "cpu"


# -- the promise, over random clusters and CPU-only jobs ------------------------------------

node_shapes = st.lists(
    st.tuples(
        st.integers(1, 8),  # GPUs
        st.integers(8, 128),  # cores
        st.integers(16, 1024),  # GiB
    ),
    min_size=1,
    max_size=4,
)
cpu_requests = st.lists(
    st.tuples(st.integers(0, 64_000), st.integers(0, 512 * GIB)), min_size=1, max_size=16
)


@settings(max_examples=60, deadline=None)
@given(
    shapes=node_shapes,
    requests=cpu_requests,
    share=st.sampled_from([0.0, 0.05, 0.125, 0.25, 0.5]),
    cycles=st.integers(1, 3),
)
def test_cpu_only_jobs_always_leave_each_gpu_its_share(shapes, requests, share, cycles):
    """After any CPU-only jobs, placed over one or more cycles, every GPU node still fits
    as many one-GPU jobs as it has GPUs, each with its per-GPU share of the CPU and memory
    kept for GPU jobs: floor((1 - share) x node's CPU / GPUs), the same for memory. A held
    base (the daemon's way, `Held`) decides the same."""
    nodes = [
        make_node(f"n{i}", gpus, f"F{i}", cpu=cores * 1000, memory=gib * GIB)
        for i, (gpus, cores, gib) in enumerate(shapes)
    ]
    tenants = (Tenant("org"), Tenant("t", "org"))
    profile = replace(Profile(), cpu_only_share=share)
    jobs = [make_job(f"c{k}", "t", 0, cpu=c, memory=m) for k, (c, m) in enumerate(requests)]
    running: list = []
    held = Held()
    for turn in range(cycles):  # the jobs arrive in `cycles` batches; what is placed runs
        batch = jobs[turn::cycles]
        snap = snapshot(nodes, batch, running, tenants=tenants)
        result = run_cycle(snap, profile)
        assert run_cycle(snap, profile, held=held) == result
        for p in result.placements:
            job = next(j for j in batch if j.id == p.job_id)
            running.append(
                make_running(job, *((a.node, []) for a in p.assignments), flavor=p.flavor)
            )
    gpu_jobs = []
    for i, (gpus, cores, gib) in enumerate(shapes):
        cpu = int((cores * 1000 - int(cores * 1000 * share)) // gpus)
        mem = int((gib * GIB - int(gib * GIB * share)) // gpus)
        gpu_jobs += [
            make_job(
                f"g{i}-{g}", "t", 1, cpu=cpu, memory=mem, flavors=[f"F{i}"], priority="best-effort"
            )
            for g in range(gpus)
        ]
    snap = snapshot(nodes, gpu_jobs, running, tenants=tenants)
    result = run_cycle(snap, profile)
    assert len(result.placements) == len(gpu_jobs), result.waiting
    assert run_cycle(snap, profile, held=held) == result
