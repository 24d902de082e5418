"""bench/fuzz.py on a tiny budget: one random example per operation as the anonymous visitor,
and its JSON's keys. No finding is asserted here: tests/api/test_schema_fuzz.py does that."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench.fuzz import PERSONAS, run_here
from tests.api.test_schema_fuzz import wsgi_in_the_test_transaction

__all__ = ["wsgi_in_the_test_transaction"]

pytestmark = pytest.mark.django_db


@pytest.mark.usefixtures("wsgi_in_the_test_transaction")
def test_the_fuzz_benchmark_reports_each_persona(db: Any) -> None:
    anonymous = next(persona for persona in PERSONAS if persona.username is None)
    result = json.loads(
        json.dumps(run_here(examples=1, negative=0, stateful=1, seed=7, personas=[anonymous]))
    )
    assert set(result) == {"seed", "examples", "negative", "stateful", "seconds", "personas"}
    assert result["seed"] == 7
    tally = result["personas"]["anonymous"]
    assert set(tally) == {
        "persona",
        "operations",
        "requests",
        "server_errors",
        "other_failures",
        "failures",
    }
    assert tally["requests"] >= tally["operations"] > 0
