"""bench.webhook runs: its decision and TLS parts on a few reviews (the plane part is the real
tests' business: tests/workloads/test_webhook_real.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench import webhook


def test_the_bench_reports_every_review_without_a_plane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out.json"
    argv = ["bench.webhook", "--reviews", "5", "--no-plane", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    webhook.main()
    result = json.loads(out.read_text())
    assert set(result) == {"decision_us", "served_over_tls"}
    assert set(result["decision_us"]) == set(webhook.REVIEWS) == set(result["served_over_tls"])
    assert all(
        r["n"] == 5 and r["p50_ms"] <= r["p99_ms"] for r in result["served_over_tls"].values()
    )
