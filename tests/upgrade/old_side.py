"""The previous release's side of the upgrade test (tests/upgrade/test_upgrade.py): a process
of the OLD tree, its daemon on the shared simulated cluster, driven one command at a time.

Started as `python <current tree>/tests/upgrade/old_side.py` with the old tree as its working
directory and first on PYTHONPATH, so every project module it imports is the old release's.
It reads one JSON command a line on stdin and answers one JSON line on stdout (logs go to
stderr):

    {"do": "setup", "backend": B}  migrate, fill (tests/backup/installation.py) on the simulated
                                cluster (GANTRY_SIM_STATE_FILE) or Kubernetes (KUBECONFIG)
    {"do": "rows"}              every row (installation.every_row)
    {"do": "costs", "hour": T}  the cost lines of that hour, as the old API answers them
    {"do": "steps", "n": 3}     n daemon cycles, the fake clock 2 s further before each
    {"do": "settle"}            cycles until no job is being placed (Kubernetes: its kubelets)
    {"do": "run"}, {"do": "pause"}   cycles in a thread until paused (while the new tree migrates)
    {"do": "standby"}           the leader steps down (SIGTERM's effect); a standby of this
                                release stays, stepping on "steps"
    {"do": "quit"}

The fill module is loaded from the current tree by its path (the old tree may not have it):
it uses only services every release since 1.0.0 has.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.remove(str(HERE))  # the old tree's `tests` package, not this folder, is importable


def load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


SETTLE_S = 60.0  # the kubelets start a bound pod within a pass or two


def make_backend(kind: str, clock: Any) -> Any:
    if kind == "kubernetes":
        from scheduler.backends.kubernetes.backend import (
            KubernetesBackend,
            api_client_from_environment,
        )
        from scheduler.backends.kubernetes.config import KubernetesConfig

        return KubernetesBackend(api_client_from_environment(), KubernetesConfig())
    from scheduler.backends.simulated.inventory import make_nodes
    from scheduler.backends.simulated.statefile import PersistentCluster

    nodes = make_nodes(4, "H100-80GB", 8, prefix="h100")
    path = Path(os.environ["GANTRY_SIM_STATE_FILE"])
    return PersistentCluster(nodes, path, clock=clock, start_delay_s=1.0, grace_cap_s=2.0)


class OldSide:
    def __init__(self) -> None:
        import django

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        django.setup()
        from django.test.utils import setup_test_environment

        setup_test_environment()  # as under pytest: the test client's host, mail kept in memory
        self.thread: threading.Thread | None = None
        self.running = threading.Event()
        self.failures: list[str] = []
        self.cycles = 0  # run in the thread

    def setup(self, backend: str) -> dict[str, Any]:
        from django.core.management import call_command

        from tests.conftest import build_org
        from tests.daemon.conftest import Env, FakeClock

        call_command("migrate", verbosity=0)
        self.installation = load("upgrade_installation", HERE.parent / "backup" / "installation.py")
        clock = FakeClock()
        self.kind = backend
        self.env = Env(build_org(), clock, make_backend(backend, clock))
        self.daemon = self.env.daemon("old-leader")
        filled = self.installation.fill(self.env, self.daemon, self._settle)
        return {"jobs": filled.jobs, "hour": filled.metered_hour.isoformat(), "clock": clock.t}

    def settle(self) -> dict[str, Any]:
        self._settle()
        return self.state()

    def _settle(self) -> None:
        if self.kind == "simulated":
            self.env.run(self.daemon, seconds=2, cycles=2)
            return
        from scheduler.models import Job

        # The kubelets (played by the test process) start the pods on their own time.
        deadline = time.monotonic() + SETTLE_S
        placing = Job.objects.filter(state__in=["admitted", "binding"])
        self.env.run(self.daemon, seconds=0.5, cycles=1)
        while placing.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
            self.env.run(self.daemon, seconds=0.5, cycles=1)

    def rows(self) -> dict[str, Any]:
        return {"rows": self.installation.every_row()}

    def costs(self, hour: str) -> dict[str, Any]:
        from datetime import datetime

        return {"costs": self.installation.cost_lines(datetime.fromisoformat(hour))}

    def steps(self, n: int) -> dict[str, Any]:
        self.env.run(self.daemon, seconds=2, cycles=n)
        return self.state()

    def run(self) -> dict[str, Any]:
        from django.db import connection

        def loop() -> None:
            while self.running.is_set():
                try:
                    self.env.run(self.daemon, seconds=0.5, cycles=1)
                    self.cycles += 1
                except Exception as exc:  # the daemon's step logs and survives its own
                    self.failures.append(repr(exc))
            connection.close()

        self.running.set()
        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()
        return {}

    def pause(self) -> dict[str, Any]:
        self.running.clear()
        assert self.thread is not None
        self.thread.join()
        return self.state()

    def standby(self) -> dict[str, Any]:
        self.daemon.lease.release()
        self.daemon = self.env.daemon("old-standby")
        return self.state()

    def state(self) -> dict[str, Any]:
        from scheduler.models import SchedulerLease

        lease = SchedulerLease.objects.first()
        return {
            "clock": self.env.clock.t,
            "leading": self.daemon.lease.leading,
            "cycle_failures": lease.cycle_failures if lease else None,
            "failures": self.failures,
            "cycles": self.cycles,
        }


def main() -> None:
    side = OldSide()
    for line in sys.stdin:
        command = json.loads(line)
        if command["do"] == "quit":
            break
        try:
            method = getattr(side, command.pop("do"))
            answer = method(**command)
        except Exception as exc:
            answer = {"error": repr(exc)}
            import traceback

            traceback.print_exc()
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
