"""Tests for the FGD fragmentation model (scheduler.core.fragmentation)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.fragmentation import (
    FragmentationModel,
    PodRequest,
    expected_fragmentation,
)

A = frozenset({"A"})
B = frozenset({"B"})


def share(milli: int, cpu: int = 1000, gmem: int = 0, models: frozenset[str] = frozenset()):
    return PodRequest(cpu, 1024, 1, milli, gpu_memory_mib=gmem, gpu_models=models)


def whole(count: int, cpu: int = 1000) -> PodRequest:
    return PodRequest(cpu, 1024, count, 1000)


CPU_ONLY = PodRequest(2000, 1024)


def make_model(
    gpu_free: list[list[int]],
    *,
    models: list[str] | None = None,
    cpu: int = 16000,
    gmem: list[list[int]] | None = None,
    **options,
) -> FragmentationModel:
    n = len(gpu_free)
    return FragmentationModel(
        models or ["A"] * n,
        [len(row) for row in gpu_free],
        [cpu] * n,
        [65536] * n,
        gpu_free=gpu_free,
        gpu_memory_free=gmem,
        **options,
    )


# One node "A": 4 devices with 1000, 1000, 600, 200 milli free (2800 in total), 16 cores.
NODE = [[1000, 1000, 600, 200]]


@pytest.mark.parametrize(
    ("mix", "expected"),
    [
        # 500m fits on devices 0..2; device 3 (200 < 500) is the fragment: 200.
        pytest.param([(share(500), 1.0)], 200.0, id="share-fits-small-device-is-fragment"),
        # Two whole GPUs fit on devices 0, 1; 600 + 200 are unusable for it: 800.
        pytest.param([(whole(2), 1.0)], 800.0, id="two-whole-gpus-partials-are-fragment"),
        # Three whole GPUs do not fit at all: every free milli-GPU counts, 2800.
        pytest.param([(whole(3), 1.0)], 2800.0, id="three-whole-gpus-do-not-fit"),
        # A CPU-only pod can use no GPU: 2800.
        pytest.param([(CPU_ONLY, 1.0)], 2800.0, id="cpu-only-uses-no-gpu"),
        # Enough GPU but 32 cores > 16 free: 2800.
        pytest.param([(share(500, cpu=32000), 1.0)], 2800.0, id="lacks-cpu"),
        # Model B only, node is A: 2800.
        pytest.param([(share(500, models=B), 1.0)], 2800.0, id="wrong-model"),
        # Model A allowed: like the first case, 200.
        pytest.param([(share(500, models=A), 1.0)], 200.0, id="allowed-model"),
        # 0.5 * 200 + 0.5 * 800 = 500 (weights are normalised: 3 and 3).
        pytest.param([(share(500), 3.0), (whole(2), 3.0)], 500.0, id="half-half-mix"),
        # 0.25 * 200 + 0.75 * 2800 = 2150.
        pytest.param([(share(500), 1.0), (CPU_ONLY, 3.0)], 2150.0, id="quarter-share"),
        # 100m fits everywhere (200 >= 100): nothing is fragment.
        pytest.param([(share(100), 1.0)], 0.0, id="tiny-share-no-fragment"),
    ],
)
def test_expected_fragmentation_of_a_node(mix, expected):
    got = expected_fragmentation(["A"], NODE, [16000], [65536], mix)
    assert got == pytest.approx([expected])
    model = make_model(NODE)
    for request, weight in mix:
        for _ in range(int(weight)):
            model.observe(request)
    assert model.node_fragmentation() == pytest.approx([expected])


def test_gpu_memory_makes_a_device_unusable():
    # 300m with 8 GiB per device: device 2 has 600m but 4 GiB, device 3 only 200m.
    # Usable: devices 0, 1; fragment: 600 + 200 = 800.
    gmem = [[16384, 16384, 4096, 16384]]
    got = expected_fragmentation(
        ["A"], NODE, [16000], [65536], [(share(300, gmem=8192), 1.0)], gmem
    )
    assert got == pytest.approx([800.0])


@pytest.mark.parametrize(
    ("gpu_free", "gmem", "request_", "expected"),
    [
        # Only device 1 has 8 GiB free as well as 400m.
        pytest.param(
            [[1000, 500, 500]],
            [[4096, 16384, 2048]],
            share(400, gmem=8192),
            (1,),
            id="only-device-with-enough-gpu-memory",
        ),
        # Mix is {600m}. Device 0 -> 400 left (fragment 400), device 1 -> 100 left
        # (fragment 100), device 2 -> 0 left (fragment 0): the exact fill wins.
        pytest.param([[1000, 700, 600]], None, share(600), (2,), id="exact-fill-wins"),
        # Whole GPUs take the lowest-indexed fully free devices.
        pytest.param([[500, 1000, 1000, 1000]], None, whole(2), (1, 2), id="whole-lowest-free"),
        pytest.param([[1000, 1000]], None, CPU_ONLY, (), id="cpu-only-no-devices"),
        # Mix {400m}. Device 0 (700m) would keep 300m, a fragment: +300. Devices 1 and 2
        # (400m each) are filled exactly: +0, equal; the lower index of the two is used.
        pytest.param([[700, 400, 400]], None, share(400), (1,), id="equal-devices-lowest"),
    ],
)
def test_choose_devices(gpu_free, gmem, request_, expected):
    model = make_model(gpu_free, gmem=gmem, quantizer="exact")
    model.observe(request_)
    assert model.choose_devices(0, request_) == expected


@pytest.mark.parametrize(
    ("request_", "devices"),
    [
        pytest.param(share(500), (1,), id="device-too-full"),
        pytest.param(whole(2), (0, 0), id="same-device-twice"),
        pytest.param(whole(2), (0,), id="too-few-devices"),
        pytest.param(PodRequest(32000, 1024), (), id="cpu-too-large"),
    ],
)
def test_assign_refuses_and_changes_nothing(request_, devices):
    model = make_model([[1000, 300]])
    model.observe(share(500))
    before = (model.gpu_free.copy(), model.cpu_free.copy(), model.node_fragmentation())
    with pytest.raises(ValueError):
        model.assign(0, request_, devices)
    assert (model.gpu_free == before[0]).all()
    assert (model.cpu_free == before[1]).all()
    assert model.node_fragmentation() == pytest.approx(before[2])


def test_copy_is_independent():
    # A gang placed tentatively on a copy leaves the original untouched until committed.
    model = make_model([[1000, 1000]])
    model.observe(whole(2))
    tentative = model.copy()
    tentative.observe(share(500))
    tentative.assign(0, whole(2), (0, 1))
    assert model.gpu_free.tolist() == [[1000, 1000]]
    assert model.mix() == [(whole(2), 1.0)]
    assert tentative.gpu_free.tolist() == [[0, 0]]


def test_choose_devices_refuses_what_does_not_fit():
    model = make_model([[1000, 300]])
    with pytest.raises(ValueError, match="does not fit"):
        model.choose_devices(0, whole(2))


@pytest.mark.parametrize(
    ("gpu_free", "candidates", "options", "expected_node"),
    [
        # Mix {500m}. Node 0 is idle (2 x 1000), node 1 has one 500m hole.
        # Node 0: 1000 -> 500, still fits, delta 0. Node 1: hole filled, delta 0 as well.
        # Equal increases: the earliest candidate wins.
        pytest.param([[1000, 1000], [500, 1000]], [0, 1], {}, 0, id="tie-to-first"),
        pytest.param([[1000, 1000], [500, 1000]], [1, 0], {}, 1, id="tie-follows-order"),
        # Mix {500m}. Node 0 has one device with 700m free: the 200m left over would be a
        # fragment (delta +200). Node 1 (one idle device) keeps 500m usable (delta 0).
        # Exact scoring and a 100m step (bin 2 vs bin 0) avoid node 0; a 500m step puts
        # both in bin 0 and packs onto the first candidate listed.
        pytest.param([[700], [1000]], [0, 1], {"quantizer": "exact"}, 1, id="exact-avoids"),
        pytest.param([[700], [1000]], [0, 1], {"step_milli": 500}, 0, id="coarse-packs"),
        pytest.param([[700], [1000]], [0, 1], {"step_milli": 100}, 1, id="fine-step-avoids"),
    ],
)
def test_select_node(gpu_free, candidates, options, expected_node):
    model = make_model(gpu_free, **options)
    model.observe(share(500))
    placement = model.select(candidates, share(500))
    assert placement is not None
    assert placement.node == expected_node


def test_score_is_inf_where_request_does_not_fit():
    # Node 0 has 300m left: no room for 500m. Node 1: 1000 -> 500, still usable, delta 0.
    model = make_model([[300], [1000]])
    model.observe(share(500))
    assert model.score([0, 1], share(500)).tolist() == [np.inf, 0.0]
    assert model.select([0], share(500)) is None


def test_mix_is_learned_from_observations_only():
    model = make_model(NODE)
    assert model.mix() == []
    for r in (share(500), share(500), share(500), whole(2)):
        model.observe(r)
    assert model.mix() == [(share(500), 0.75), (whole(2), 0.25)]


def test_half_life_weights_recent_requests_more():
    # Half-life of 1 request: share(500) decays to 0.5 when whole(2) arrives with weight 1.
    # Probabilities 0.5 / 1.5 and 1 / 1.5.
    model = make_model(NODE, half_life=1.0)
    model.observe(share(500))
    model.observe(whole(2))
    assert [p for _, p in model.mix()] == pytest.approx([1 / 3, 2 / 3])


def test_coverage_keeps_the_popular_types():
    # 3 x share(500), 1 x whole(2): the top type alone covers 75% >= 70%.
    model = make_model(NODE, coverage=0.7)
    for r in (share(500), whole(2), share(500), share(500)):
        model.observe(r)
    assert model.mix() == [(share(500), 1.0)]


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"cpu_milli": -1, "memory_mib": 0}, id="negative-cpu"),
        pytest.param({"cpu_milli": 0, "memory_mib": 0, "gpu_milli": 500}, id="share-no-count"),
        pytest.param(
            {"cpu_milli": 0, "memory_mib": 0, "gpu_count": 2, "gpu_milli": 500}, id="multi-share"
        ),
        pytest.param(
            {"cpu_milli": 0, "memory_mib": 0, "gpu_count": 1, "gpu_milli": 1001}, id="over-1000"
        ),
    ],
)
def test_bad_requests_are_refused(kwargs):
    with pytest.raises(ValueError):
        PodRequest(**kwargs)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"quantizer": "round"}, id="unknown-quantizer"),
        pytest.param({"tie_break": "random"}, id="unknown-tie-break"),
        pytest.param({"step_milli": 0}, id="zero-step"),
        pytest.param({"coverage": 0}, id="zero-coverage"),
    ],
)
def test_bad_profiles_are_refused(options):
    with pytest.raises(ValueError):
        make_model(NODE, **options)


def test_whole_gpu_count_defaults_to_whole_devices():
    assert PodRequest(1000, 1024, gpu_count=2).gpu_milli == 1000


def _replay(options: dict) -> list[tuple[int, tuple[int, ...]]]:
    model = make_model([[1000] * 4, [1000] * 2, [1000] * 8], models=["A", "B", "A"], **options)
    stream = [share(300), whole(2), share(700), CPU_ONLY, share(500, models=A), whole(1)] * 4
    placed = []
    for r in stream:
        model.observe(r)
        placement = model.select([0, 1, 2], r)
        if placement is not None:
            model.assign(placement.node, r, placement.devices)
            placed.append((placement.node, placement.devices))
    return placed


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({}, id="default"),
        pytest.param({"quantizer": "sigmoid"}, id="sigmoid"),
        pytest.param({"quantizer": "exact", "tie_break": "bestfit"}, id="exact-bestfit"),
    ],
)
def test_deterministic(options):
    first = _replay(options)
    assert len(first) > 10
    assert _replay(options) == first


def test_select_does_not_change_state():
    model = make_model([[1000, 400], [1000, 1000]])
    model.observe(share(300))
    before = model.node_fragmentation().copy()
    first = model.select([0, 1], share(300))
    assert model.select([0, 1], share(300)) == first
    assert model.node_fragmentation() == pytest.approx(before)


# -- property: the cache and the batch scores equal a full recomputation --------------------

MODELS = ["A", "B"]
requests = st.one_of(
    st.builds(
        share,
        st.sampled_from([100, 250, 300, 500, 700, 900]),
        cpu=st.sampled_from([0, 4000, 12000]),
        gmem=st.sampled_from([0, 0, 4096]),
        models=st.sampled_from([frozenset(), A, B]),
    ),
    st.builds(whole, st.integers(1, 3), cpu=st.sampled_from([0, 8000])),
    st.just(CPU_ONLY),
)


def _brute_force_scores(model: FragmentationModel, r: PodRequest) -> list[float]:
    """Per node: min over device choices of (frag after - frag before), by full recompute."""
    mix = model.mix()
    args = (model.gpu_free, model.cpu_free, model.memory_free, mix, model.gpu_memory_free)
    models = [MODELS[i] for i in model.model_ids]
    before = expected_fragmentation(models, *args)
    out = []
    for i in range(len(model.cpu_free)):
        fits = model.feasible(r)[i]
        if not fits:
            out.append(np.inf)
            continue
        if r.is_share:
            options = [
                (d,)
                for d in range(model.gpu_free.shape[1])
                if model.gpu_free[i, d] >= r.gpu_milli
                and model.gpu_memory_free[i, d] >= r.gpu_memory_mib
            ]
        else:
            options = [model.choose_devices(i, r)]
        best = np.inf
        for devices in options:
            free, gmem = model.gpu_free.copy(), model.gpu_memory_free.copy()
            cpu, mem = model.cpu_free.copy(), model.memory_free.copy()
            for d in devices:
                free[i, d] -= r.gpu_milli
                gmem[i, d] -= r.gpu_memory_mib
            cpu[i] -= r.cpu_milli
            mem[i] -= r.memory_mib
            after = expected_fragmentation(models, free, cpu, mem, mix, gmem)
            best = min(best, after[i] - before[i])
        out.append(best)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    devices=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    stream=st.lists(st.tuples(requests, st.booleans()), min_size=1, max_size=12),
    seed=st.integers(0, 2**16),
)
def test_cache_and_scores_equal_recompute(devices, stream, seed):
    rng = np.random.default_rng(seed)
    n = len(devices)
    model = FragmentationModel(
        [MODELS[i % 2] for i in range(n)],
        devices,
        [16000] * n,
        [65536] * n,
        gpu_memory_free=[[16384] * max(devices)] * n,
        quantizer="exact",
    )
    for r, place in stream:
        model.observe(r)
        if place:
            placement = model.select(list(range(n)), r)
            if placement is not None:
                model.assign(placement.node, r, placement.devices)
        else:  # an outside change: a node gets some of its resources back or loses some
            i = int(rng.integers(n))
            model.update_node(
                i,
                gpu_free_milli=rng.integers(0, 1001, devices[i]),
                cpu_free_milli=int(rng.integers(0, 16001)),
                memory_free_mib=65536,
                gpu_memory_free_mib=rng.integers(0, 16385, devices[i]),
            )
        recomputed = expected_fragmentation(
            [MODELS[i % 2] for i in range(n)],
            model.gpu_free,
            model.cpu_free,
            model.memory_free,
            model.mix(),
            model.gpu_memory_free,
        )
        assert model.node_fragmentation() == pytest.approx(recomputed)
        probe = stream[int(rng.integers(len(stream)))][0]
        assert model.score(list(range(n)), probe) == pytest.approx(
            _brute_force_scores(model, probe)
        )


@pytest.mark.parametrize(
    ("options", "expected_node"),
    [
        # Mix {share(500) with 1 core, CPU-only}. A CPU-only pod changes nothing GPU types
        # need on either node: delta 0 on idle node 0 (2000m free) and on node 1 (GPUs taken).
        pytest.param({"cpu_only_to_busy": False}, 0, id="tie-to-order"),
        # Sent where the GPUs are already busy: node 1 has 0m free, node 0 2000m.
        pytest.param({"cpu_only_to_busy": True}, 1, id="tie-to-busy-gpus"),
    ],
)
def test_cpu_only_pods_go_where_gpus_are_busy(options, expected_node):
    model = make_model([[1000, 1000], [0, 0]], **options)
    model.observe(share(500))
    model.observe(CPU_ONLY)
    placement = model.select([0, 1], CPU_ONLY)
    assert placement is not None
    assert (placement.node, placement.devices) == (expected_node, ())


@pytest.mark.parametrize(
    ("options", "expected_node"),
    [
        # Mix: 1 x share(500) needing 2 cores, 9 x CPU-only (2 cores). Node 0 has 3 cores:
        # after a CPU-only pod 1 core is left, the share type no longer fits there and its
        # fragment goes 0 -> 1000m: delta 0.1 * 1000 = +100m. Node 1 (16 cores): delta 0.
        # A 500m step rounds both to bin 0 and keeps node order; exact CPU-only scoring
        # sees the 100m.
        pytest.param({"step_milli": 500, "cpu_only_step": None}, 0, id="coarse-keeps-order"),
        pytest.param({"step_milli": 500, "cpu_only_step": 0}, 1, id="cpu-only-exact"),
    ],
)
def test_cpu_only_step(options, expected_node):
    model = FragmentationModel(["A", "A"], [1, 1], [3000, 16000], [65536, 65536], **options)
    model.observe(share(500, cpu=2000))
    for _ in range(9):
        model.observe(CPU_ONLY)
    placement = model.select([0, 1], CPU_ONLY)
    assert placement is not None
    assert placement.node == expected_node


@pytest.mark.parametrize("half_life", [None, 4.0])
def test_observing_a_count_is_observing_one_by_one(half_life):
    """The scheduler observes each request type once with its count per cycle."""
    one_by_one, counted = (make_model(NODE, half_life=half_life) for _ in range(2))
    for request, count in [(share(500), 3), (whole(2), 2), (share(500), 1)]:
        for _ in range(count):
            one_by_one.observe(request)
        counted.observe(request, count)
    expected = one_by_one.mix()
    assert [r for r, _ in counted.mix()] == [r for r, _ in expected]
    assert [p for _, p in counted.mix()] == pytest.approx([p for _, p in expected])
