"""bench/k8s_leases.py at a tiny scale on its own plane: every way renews every lease (a way
that failed one would raise), and the JSON names each round. No timing is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.k8s_leases import run
from tests.k8s.real_plane import require_binaries

pytestmark = pytest.mark.kubernetes


def test_every_way_renews_every_lease_twice(tmp_path: Path) -> None:
    require_binaries()
    out = run(tmp_path / "cp", leases=3)
    assert out["leases"] == 3
    ways = [r["way"] for r in out["rounds"]]
    assert ways == ["typed", "fanout_2", "fanout_8", "fanout_16"] * 2
    assert all(r["round_s"] >= 0 for r in out["rounds"])
