"""A controller manager that exited (it gives up for good when it loses the API server early in
its start) is started again after an API server restart, as a kubelet restarts a crashed static
pod: without it no namespace gets its service account and admission refuses every pod."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from devcluster.plane import ControlPlane, _alive
from tests.k8s.real_plane import require_binaries

pytestmark = pytest.mark.kubernetes


def test_a_dead_controller_manager_is_started_again_after_an_apiserver_restart(
    tmp_path: Path,
) -> None:
    require_binaries()
    plane = ControlPlane(tmp_path / "cp").start()
    try:
        assert plane.state is not None
        dead = plane.state.pids["kube-controller-manager"]
        os.kill(dead, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _alive(dead) and time.monotonic() < deadline:
            time.sleep(0.05)
        plane.restart_apiserver()
        revived = plane.state.pids["kube-controller-manager"]
        assert revived != dead and _alive(revived)
    finally:
        plane.stop()
