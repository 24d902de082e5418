"""devcluster keeps the processes it starts and reaps them when it stops them (issue 22): it
dropped each Popen while the process ran, a ResourceWarning that the suite (warnings are
errors) reported at the first test to start a plane."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import pytest

from devcluster.plane import ControlPlane
from tests.k8s.real_plane import require_binaries

pytestmark = pytest.mark.kubernetes


def test_starting_and_stopping_a_plane_drops_no_live_process(tmp_path: Path) -> None:
    require_binaries()
    plane = ControlPlane(tmp_path / "plane")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            plane.start(controller_manager=False)
            gc.collect()
        finally:
            plane.stop()
        gc.collect()
    dropped = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert dropped == []
