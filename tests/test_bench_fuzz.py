"""bench/fuzz/ on a tiny budget: one fuzzed case per operation as the anonymous visitor, DEBUG
off, and its JSON's shape. No finding is asserted here: tests/api/test_schema_fuzz.py does that
for every persona."""

from __future__ import annotations

import json

import pytest

from bench.fuzz import PERSONAS, run_here
from tests.api.test_schema_fuzz import closed_statements_removed_after

__all__ = ["closed_statements_removed_after"]


@pytest.mark.usefixtures("closed_statements_removed_after")
def test_the_fuzz_benchmark_reports_each_persona() -> None:
    anonymous = next(persona for persona in PERSONAS if persona.username is None)
    result = json.loads(
        json.dumps(
            run_here(examples=1, phases=("fuzzing",), debug=(False,), seed=7, personas=[anonymous])
        )
    )
    assert set(result) == {"seed", "examples", "phases", "seconds", "runs"}
    assert result["seed"] == 7 and result["phases"] == ["fuzzing"]
    assert set(result["runs"]) == {"debug-off"}
    tally = result["runs"]["debug-off"]["anonymous"]
    assert set(tally) == {
        "persona",
        "operations",
        "requests",
        "successes",
        "server_errors",
        "other_failures",
        "failures",
        "errors",
        "seconds",
    }
    assert tally["requests"] >= tally["operations"] > 0
    assert tally["server_errors"] == 0 and not tally["errors"], tally
