"""bench/engine_replay.py: the version-independent form of the daemon's snapshots and
decisions, their comparison, and the daemon's engine found and recorded in today's layout.
No timing is asserted."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import pytest
from django.utils import timezone

from bench import engine_replay
from bench.engine_replay import (
    FixedClock,
    build_snapshots,
    canonical,
    compare_snapshots,
    daemon_module,
    django_clock,
    parse_renames,
    recorded_engine,
    renamed,
)
from scheduler.core import Profile
from scheduler.core.types import JobKind, Placement, ReplicaAssignment, Snapshot


class Colour(Enum):
    RED = "red"


@dataclass(frozen=True, slots=True)
class Inner:
    colour: Colour
    tags: frozenset[str]


@dataclass(frozen=True)
class Outer:
    name: str
    inner: tuple[Inner, ...]
    by_id: dict[int, float]
    at: datetime | None = None


def test_canonical_form_is_json_of_fields_with_type_names_enum_values_and_sorted_sets() -> None:
    value = Outer(
        "a",
        (Inner(Colour.RED, frozenset({"b", "a"})),),
        {2: 0.5, 1: 1.5},
        datetime(2026, 1, 2, tzinfo=UTC),
    )
    assert canonical(value) == {
        "__type__": "Outer",
        "name": "a",
        "inner": [{"__type__": "Inner", "colour": "red", "tags": ["a", "b"]}],
        "by_id": {"1": 1.5, "2": 0.5},
        "at": "2026-01-02T00:00:00+00:00",
    }
    json.dumps(canonical(value))  # JSON as it stands


def test_canonical_form_of_the_engines_types_spells_enums_by_value() -> None:
    placement = Placement(job_id="7", flavor="h100", assignments=(ReplicaAssignment(0, "n1", ()),))
    out = canonical(placement)
    assert out["__type__"] == "Placement"
    assert out["job_id"] == "7"
    assert out["assignments"][0]["__type__"] == "ReplicaAssignment"
    assert canonical(JobKind.BATCH) == "batch"


def test_canonical_form_refuses_what_it_cannot_spell_rather_than_guessing() -> None:
    with pytest.raises(TypeError, match="object"):
        canonical(object())


def _cycles(*values: int, field: str = "x") -> dict[str, Any]:
    return {
        "settings": {"cycles": len(values)},
        "cycles": [{"snapshot": {"__type__": "S", field: [v]}} for v in values],
    }


def test_comparison_names_the_first_differing_cycle_and_field_and_counts_fields() -> None:
    out = compare_snapshots(_cycles(1, 2, 3), _cycles(1, 5, 6))
    assert out["same"] is False
    assert out["cycles_that_differ"] == [1, 2]
    assert out["first_difference"] == {
        "cycle": 1,
        "field": "snapshot.x[0]",
        "new": "2",
        "old": "5",
    }
    assert out["fields_that_differ"] == {"snapshot.x[*]": 2}
    assert compare_snapshots(_cycles(1, 2), _cycles(1, 2))["same"] is True


def test_comparison_sees_fewer_cycles_and_other_settings() -> None:
    shorter = _cycles(1, 2)
    shorter["settings"] = _cycles(1, 2, 3)["settings"]
    assert compare_snapshots(_cycles(1, 2, 3), shorter)["same"] is False
    assert "settings_differ" in compare_snapshots(_cycles(1, 2, 3), _cycles(1, 2))


def test_a_field_renamed_on_purpose_compares_equal_once_renamed_and_only_in_its_type() -> None:
    old, new = _cycles(1, field="preempted"), _cycles(1, field="victims")
    assert compare_snapshots(new, old)["fields_that_differ"] == {
        "snapshot.preempted": 1,
        "snapshot.victims": 1,
    }
    assert compare_snapshots(new, renamed(old, parse_renames(["S.preempted=victims"])))["same"]
    assert not compare_snapshots(new, renamed(old, parse_renames(["T.preempted=victims"])))["same"]


def test_a_misspelt_rename_is_refused() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"Type\.old=new"):
        parse_renames(["preempted=victims"])


def test_the_daemons_engine_is_found_in_todays_layout_and_recorded_then_restored() -> None:
    module = daemon_module()
    assert hasattr(module, "Daemon")
    engine = module.run_cycle
    calls: list[tuple[Any, Any, Any]] = []
    snapshot = Snapshot(now=0.0, nodes=(), tenants=(), priority_classes=())
    with recorded_engine(calls):
        assert module.run_cycle is not engine
        result = module.run_cycle(snapshot, Profile())
    assert module.run_cycle is engine
    assert calls == [(snapshot, Profile(), result)]


def test_a_layout_that_does_not_exist_is_passed_over() -> None:
    missing = ("scheduler.no_such_module", *engine_replay.DAEMON_MODULES)
    assert engine_replay._first("Daemon", missing) is daemon_module().Daemon
    with pytest.raises(LookupError, match="no_such_attribute"):
        engine_replay._first("no_such_attribute", missing)


def test_djangos_clock_follows_the_fixed_clock_inside_the_block_only() -> None:
    clock = FixedClock(1_800_000_000.0)
    with django_clock(clock):
        assert timezone.now() == datetime.fromtimestamp(1_800_000_000.0, tz=UTC)
        clock.advance(2.5)
        assert timezone.now() == datetime.fromtimestamp(1_800_000_002.5, tz=UTC)
    assert timezone.now().year >= 2026
    assert timezone.now() != clock.dt()


@pytest.mark.django_db(transaction=True)
def test_the_daemons_first_cycles_are_recorded_on_the_fixed_clock() -> None:
    cycles = build_snapshots(3, {"medium": 1, "small": 1}, 0.1, Profile())
    assert len(cycles) == 3
    nows = [c["snapshot"]["now"] for c in cycles]
    assert nows == pytest.approx([engine_replay.CLOCK_START + 0.1 * i for i in (1, 2, 3)])
    assert cycles[0]["snapshot"]["__type__"] == "Snapshot"
    assert len(cycles[0]["snapshot"]["pending"]) == 60  # 30 teams, one of each class
    assert cycles[0]["decisions"]["__type__"] == "CycleResult"
    assert cycles[0]["decisions"]["placements"]
    json.dumps(cycles)
