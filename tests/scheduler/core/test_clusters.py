"""Several clusters in the engine: a job runs in exactly one (a gang never spans two values of
`gantry.io/cluster`), required clusters and regions are kept, preferred ones chosen when the
job fits there, and a gang that fits only in one cluster whole is placed there."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.clusters import CLUSTER_LABEL, REGION_LABEL
from scheduler.core.types import JobRequest, Node, RunningJob
from tests.scheduler.core.builders import (
    cycle,
    make_job,
    make_node,
    make_running,
    make_tenants,
    placed_nodes,
    snapshot,
)

TENANTS = make_tenants(("team-a", 512, None))


def node(name: str, gpus: int = 8, cluster: str = "", region: str = "") -> Node:
    labels = {k: v for k, v in ((CLUSTER_LABEL, cluster), (REGION_LABEL, region)) if v}
    return replace(make_node(name, gpus), labels=labels)


def cluster_of(nodes: list[Node], names: list[str]) -> set[str]:
    by_name = {n.name: n for n in nodes}
    return {by_name[name].labels.get(CLUSTER_LABEL, "") for name in names}


def place(nodes: list[Node], job: JobRequest, running: tuple[RunningJob, ...] = ()) -> list[str]:
    return placed_nodes(cycle(snapshot(nodes, [job], running, tenants=TENANTS)), job.id)


# a:1 (8 GPUs) is the best first node (node order breaks the tie with b's), but a holds
# 8 + 4 = 12 < 16 GPUs: without the rule the gang took a:1 and one of b's nodes.
SPLIT = [node("a:1", 8, "a"), node("a:2", 4, "a"), node("b:1", 8, "b"), node("b:2", 8, "b")]


@pytest.mark.parametrize(
    ("nodes", "job", "expected"),
    [
        (SPLIT, make_job("j", gpus=8, replicas=2), ["b:1", "b:2"]),
        (SPLIT, make_job("j", gpus=4, replicas=3), ["a:1", "a:1", "a:2"]),
        # 8 + 4 in a: the gang of 3 x 4 fits in a whole; best fit starts on a:2 (4 free).
        (
            [node("x", 8), node("y", 8, "b"), node("z", 8, "b")],
            make_job("j", gpus=8, replicas=2),
            ["y", "z"],
        ),
    ],
    ids=["fits-only-in-b", "fits-in-a-first", "unlabelled-nodes-are-one-cluster"],
)
def test_a_gang_is_placed_in_one_cluster(
    nodes: list[Node], job: JobRequest, expected: list[str]
) -> None:
    got = place(nodes, job)
    assert sorted(got) == sorted(expected)
    assert len(cluster_of(nodes, got)) == 1


def test_a_gang_larger_than_every_cluster_never_fits_though_the_total_would_hold_it() -> None:
    nodes = [node("a:1", 8, "a"), node("b:1", 8, "b"), node("b:2", 4, "b")]
    result = cycle(snapshot(nodes, [make_job("j", gpus=8, replicas=2)], tenants=TENANTS))
    assert result.placement_for("j") is None
    reason = result.reason_for("j")
    assert reason is not None and reason.code == "no_matching_node"
    # b's nodes hold one 8-GPU replica (b:2 has 4 GPUs), a's one: at most 1 of 2
    assert "nodes of any one cluster hold at most 1 of the 2 replicas" in reason.message


@pytest.mark.parametrize(
    ("job", "expected_cluster"),
    [
        (make_job("j", gpus=2), "a"),  # best fit: a:1 has 4 free, b's 8
        (replace(make_job("j", gpus=2), clusters=("b",)), "b"),
        (replace(make_job("j", gpus=2), regions=("eu",)), "b"),
        (replace(make_job("j", gpus=2), preferred_clusters=("b",)), "b"),
        (replace(make_job("j", gpus=2, replicas=3), preferred_clusters=("b",)), "b"),
        # prefers a, but a (4 GPUs) cannot hold 2 x 4 whole: placed in b
        (replace(make_job("j", gpus=4, replicas=2), preferred_clusters=("a",)), "b"),
    ],
    ids=[
        "best-fit",
        "requires-b",
        "requires-region",
        "prefers-b",
        "gang-prefers-b",
        "prefers-a-too-small",
    ],
)
def test_required_and_preferred_clusters(job: JobRequest, expected_cluster: str) -> None:
    nodes = [node("a:1", 4, "a", "us"), node("b:1", 8, "b", "eu"), node("b:2", 8, "b", "eu")]
    assert cluster_of(nodes, place(nodes, job)) == {expected_cluster}


def test_a_required_cluster_that_is_full_or_unknown_makes_the_job_wait_with_why() -> None:
    nodes = [node("a:1", 8, "a"), node("b:1", 2, "b")]
    for clusters in (("b",), ("nowhere",)):
        job = replace(make_job("j", gpus=4), clusters=clusters)
        result = cycle(snapshot(nodes, [job], tenants=TENANTS))
        assert result.placement_for("j") is None
    reason = result.reason_for("j")
    assert reason is not None and "clusters nowhere" in reason.message


def test_elastic_extras_join_the_gangs_cluster() -> None:
    nodes = [node("a:1", 2, "a"), node("b:1", 8, "b")]
    job = make_job("inf", gpus=1, replicas=4, min_replicas=1)
    running = make_running(job, ("a:1", [0]), started_at=0.0)
    result = cycle(snapshot(nodes, [], [running], tenants=TENANTS))
    grown = result.placement_for("inf")
    # a:1 has 1 GPU left: one more replica there; none in b although b has room.
    assert grown is not None and [a.node for a in grown.assignments] == ["a:1"]


# --- properties ----------------------------------------------------------------------------


@st.composite
def clustered_nodes(draw: st.DrawFn) -> list[Node]:
    count = draw(st.integers(1, 6))
    return [
        node(
            f"n{i}",
            draw(st.sampled_from([2, 4, 8])),
            draw(st.sampled_from(["", "a", "b", "c"])),
            draw(st.sampled_from(["", "eu", "us"])),
        )
        for i in range(count)
    ]


@st.composite
def constrained_jobs(draw: st.DrawFn) -> list[JobRequest]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        replicas = draw(st.integers(1, 4))
        job = make_job(
            f"j{i}",
            gpus=draw(st.sampled_from([1, 2, 4, 8])),
            replicas=replicas,
            min_replicas=draw(st.sampled_from([None, 1])) if replicas > 1 else None,
            submitted_at=float(i),
        )
        out.append(
            replace(
                job,
                clusters=draw(st.sampled_from([(), ("a",), ("b", "c")])),
                regions=draw(st.sampled_from([(), ("eu",)])),
                preferred_clusters=draw(st.sampled_from([(), ("b",)])),
            )
        )
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clustered_nodes(), jobs=constrained_jobs())
def test_no_placement_ever_spans_clusters_or_leaves_its_required_ones(
    nodes: list[Node], jobs: list[JobRequest]
) -> None:
    by_name = {n.name: n for n in nodes}
    first = cycle(snapshot(nodes, jobs, tenants=TENANTS))
    by_id = {j.id: j for j in jobs}
    running = tuple(
        RunningJob(by_id[p.job_id], p.flavor, p.assignments, 0.0) for p in first.placements
    )
    # a second cycle grows the elastic jobs beside their running gangs
    second = cycle(snapshot(nodes, [], running, tenants=TENANTS))
    held: dict[str, list[str]] = {}
    for p in (*first.placements, *second.placements):
        held.setdefault(p.job_id, []).extend(a.node for a in p.assignments)
    for job_id, names in held.items():
        job = by_id[job_id]
        labels = [by_name[name].labels for name in names]
        assert len({lb.get(CLUSTER_LABEL, "") for lb in labels}) == 1, (job_id, names)
        assert not job.clusters or all(lb.get(CLUSTER_LABEL) in job.clusters for lb in labels)
        assert not job.regions or all(lb.get(REGION_LABEL) in job.regions for lb in labels)


def whole_slots(nodes: list[Node], gpus: int) -> int:
    return sum(len(n.devices) // gpus for n in nodes)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=clustered_nodes(),
    gpus=st.sampled_from([1, 2, 4, 8]),
    replicas=st.integers(1, 6),
)
def test_a_gang_that_fits_whole_in_some_cluster_is_placed_there(
    nodes: list[Node], gpus: int, replicas: int
) -> None:
    clusters: dict[str, list[Node]] = {}
    for n in nodes:
        clusters.setdefault(n.labels.get(CLUSTER_LABEL, ""), []).append(n)
    fits = {c for c, members in clusters.items() if whole_slots(members, gpus) >= replicas}
    job = make_job("g", gpus=gpus, replicas=replicas)
    result = cycle(snapshot(nodes, [job], tenants=TENANTS))
    placement = result.placement_for("g")
    if not fits:
        assert placement is None
        return
    assert placement is not None, result.reason_for("g")
    assert cluster_of(nodes, [a.node for a in placement.assignments]) <= fits


def test_preemption_stops_victims_only_in_the_cluster_the_gang_lands_in() -> None:
    nodes = [node("a:1", 8, "a"), node("a:2", 8, "a"), node("b:1", 8, "b")]
    low = [make_job(f"low-{i}", gpus=8, priority="low") for i in range(3)]
    # b's job started last: the least work lost, the cheapest victim, taken first by the
    # search; a gang of 2 x 8 cannot use its room alone, so it is put back
    running = [
        make_running(low[0], ("a:1", range(8)), started_at=0.0),
        make_running(low[1], ("a:2", range(8)), started_at=10.0),
        make_running(low[2], ("b:1", range(8)), started_at=500.0),
    ]
    gang = make_job("gang", gpus=8, replicas=2, priority="high")
    result = cycle(snapshot(nodes, [gang], running, tenants=TENANTS))
    assert {p.job_id for p in result.preemptions} == {"low-0", "low-1"}
    assert sorted(placed_nodes(result, "gang")) == ["a:1", "a:2"]
