"""The profile is data, validated when loaded; errors name what is wrong."""

from __future__ import annotations

import pytest

from scheduler.core import Profile, ProfileError


def test_defaults_and_overrides():
    profile = Profile.from_dict(
        {
            "name": "research",
            "plugins": {"score": {"GpuFit": 1, "FragmentationScore": 0}},
            "fair_share": {"half_life_s": 3600, "history_weight": 0.25},
            "preemption": {"min_runtime_s": 60, "max_candidates": 16},
            "backfill": {"enabled": False},
            "order": {"guaranteed_first": False, "hold_for_higher_priority": False},
        }
    )
    assert profile.name == "research"
    assert profile.score_weights == {"GpuFit": 1.0, "FragmentationScore": 0.0}
    assert (profile.half_life_s, profile.history_weight) == (3600.0, 0.25)
    assert (profile.min_runtime_s, profile.max_preemption_candidates) == (60.0, 16)
    assert profile.backfill is False
    assert profile.guaranteed_first is False and Profile().guaranteed_first is True
    assert profile.hold_for_higher_priority is False and Profile().hold_for_higher_priority
    assert profile.aging_per_hour == Profile().aging_per_hour


BAD = [
    ("unknown-plugin", {"plugins": {"score": {"BinPackMagic": 1}}}, "BinPackMagic"),
    ("negative-weight", {"plugins": {"score": {"GpuFit": -1}}}, "plugins.score.GpuFit"),
    ("weight-not-a-number", {"plugins": {"score": {"GpuFit": "heavy"}}}, "plugins.score.GpuFit"),
    ("weight-infinite", {"plugins": {"score": {"GpuFit": float("inf")}}}, "plugins.score.GpuFit"),
    ("all-weights-zero", {"plugins": {"score": {"GpuFit": 0}}}, "positive weight"),
    ("unknown-section", {"quantum": {}}, "quantum"),
    ("unknown-key", {"backfill": {"enabled": True, "greedy": True}}, "greedy"),
    ("half-life-zero", {"fair_share": {"half_life_s": 0}}, "fair_share.half_life_s"),
    ("history-weight-above-one", {"fair_share": {"history_weight": 1.5}}, "history_weight"),
    ("bool-is-not-a-number", {"preemption": {"min_runtime_s": True}}, "min_runtime_s"),
    ("enabled-not-bool", {"backfill": {"enabled": "yes"}}, "backfill.enabled"),
    ("guaranteed-first-not-bool", {"order": {"guaranteed_first": 1}}, "order.guaranteed_first"),
    ("hold-not-bool", {"order": {"hold_for_higher_priority": "yes"}}, "hold_for_higher_priority"),
    ("candidates-not-int", {"preemption": {"max_candidates": 2.5}}, "max_candidates"),
]


@pytest.mark.parametrize(("data", "named"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_profiles_name_the_problem(data, named):
    with pytest.raises(ProfileError, match=named):
        Profile.from_dict(data)


def test_every_error_is_reported_at_once_with_its_key_and_value():
    # one bad value per section, an unknown key, an unknown plugin: all seven at once
    with pytest.raises(ProfileError) as info:
        Profile.from_dict(
            {
                "name": "",
                "plugins": {"score": {"GpuFit": -1, "Magic": 1}},
                "fair_share": {"half_life_s": 0},
                "preemption": {"min_runtime_s": "five minutes", "max_candidates": 0},
                "backfill": {"greedy": True},
            }
        )
    assert dict(info.value.errors) == {
        "name": "expected a non-empty string, got ''",
        "plugins.score.GpuFit": "must be >= 0, got -1",
        "plugins.score.Magic": (
            "unknown plugin (known: FragmentationScore, GpuFit, TopologyScore)"
        ),
        "fair_share.half_life_s": "must be > 0, got 0",
        "preemption.min_runtime_s": "expected a finite number, got 'five minutes'",
        "preemption.max_candidates": "expected a positive integer, got 0",
        "backfill.greedy": "unknown key (known: enabled, unknown_runtime_s)",
    }
    assert "preemption.min_runtime_s: expected a finite number" in str(info.value)


HEADER = {"apiVersion": "gantry.io/v1", "kind": "SchedulingProfile"}

DOCUMENTS = [
    ("no-header", {"name": "x"}, {"apiVersion", "kind"}),
    ("wrong-kind", {**HEADER, "kind": "KubeSchedulerConfiguration"}, {"kind"}),
    ("wrong-version", {**HEADER, "apiVersion": "gantry.io/v2"}, {"apiVersion"}),
    (
        "header-and-body-errors",
        {"kind": "SchedulingProfile", "preemption": {"min_runtime_s": -1}},
        {"apiVersion", "preemption.min_runtime_s"},
    ),
    ("not-a-mapping", ["a", "list"], {"(document)"}),
    ("section-not-a-mapping", {**HEADER, "backfill": [True]}, {"backfill"}),
]


@pytest.mark.parametrize(
    ("document", "paths"), [d[1:] for d in DOCUMENTS], ids=[d[0] for d in DOCUMENTS]
)
def test_documents_need_the_header_and_name_every_bad_key(document, paths):
    with pytest.raises(ProfileError) as info:
        Profile.from_document(document)
    assert {path for path, _ in info.value.errors} == paths


def test_a_document_reads_back_what_it_wrote():
    tuned = Profile(name="bench", min_runtime_s=0.0, score_weights={"GpuFit": 1.0})
    for profile in (Profile(), tuned):
        assert Profile.from_document(profile.to_document()) == profile
    assert Profile.from_document({**HEADER}) == Profile()
