"""bench/cost_reads.py at a tiny scale: it builds and meters a day and every cost route it
measures answers. No timing is asserted (the benchmark is not a test)."""

from __future__ import annotations

from typing import Any

from bench.cost_reads import run_here


def test_the_cost_reads_benchmark_answers_every_route(db: Any) -> None:
    result = run_here(16, 1, 50, 1)
    assert len(result) == 3
    for url, figures in result.items():
        assert figures["status"] == 200, url
        # A cold request rates the month: it reads more than a warm one, which finds it kept.
        assert figures["cold"]["queries"] > figures["warm"]["queries"] > 0, url
        assert figures["cold"]["cpu_s"] >= 0 and figures["warm"]["cpu_s"] >= 0, url
