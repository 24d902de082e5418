"""`manage.py run_scheduler`: the scheduler daemon (one leader, any number of standbys).

    manage.py run_scheduler                       # simulated cluster of the demo inventory
    manage.py run_scheduler --nodes-csv PATH      # simulated cluster of an openb node list
    manage.py run_scheduler --backend kubernetes  # the cluster of KUBECONFIG / in-cluster
    manage.py run_scheduler --no-demo-load        # no generated jobs

SIGTERM and SIGINT finish the current cycle, step down (so a standby takes over at once)
and exit.
"""

from __future__ import annotations

import importlib
import signal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from scheduler.daemon import Daemon
from scheduler.leader import Lease


def make_backend(kind: str, nodes_csv: Path | None) -> Any:
    if kind == "simulated":
        from scheduler.backends.simulated import SimulatedCluster, nodes_from_openb_csv
        from scheduler.demo import demo_nodes

        nodes = nodes_from_openb_csv(nodes_csv) if nodes_csv else demo_nodes()
        return SimulatedCluster(nodes)
    if kind == "kubernetes":
        try:
            module = importlib.import_module("scheduler.backends.kubernetes")
        except ImportError as error:
            raise CommandError(f"the kubernetes backend is not available: {error}") from error
        factory = getattr(module, "from_environment", None) or module.KubernetesBackend
        return factory()
    raise CommandError(f"unknown backend {kind!r} (simulated or kubernetes)")


class Command(BaseCommand):
    help = "Run the scheduler daemon."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--backend", default=settings.GANTRY_CLUSTER_BACKEND)
        parser.add_argument("--nodes-csv", type=Path, default=None)
        parser.add_argument("--interval", type=float, default=settings.GANTRY_SCHEDULER_INTERVAL_S)
        parser.add_argument("--lease-ttl", type=float, default=6.0)
        parser.add_argument(
            "--no-demo-load",
            action="store_true",
            help="Do not submit generated demo jobs (simulated backend only).",
        )
        parser.add_argument("--demo-every", type=float, default=15.0)
        parser.add_argument(
            "--per-queue",
            type=int,
            default=0,
            help="queued jobs per tenant x priority class the engine sees (0: all)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        backend = make_backend(options["backend"], options["nodes_csv"])
        on_cycle = None
        if options["backend"] == "simulated" and not options["no_demo_load"]:
            from scheduler.daemon_demo import DemoLoad

            on_cycle = DemoLoad(backend.clock, every_s=options["demo_every"]).tick
        daemon = Daemon(
            backend,
            lease=Lease(ttl_s=options["lease_ttl"]),
            interval_s=options["interval"],
            on_cycle=on_cycle,
            sync_every_s=min(1.0, options["interval"]),
            per_queue=options["per_queue"],
        )

        def stop(signum: int, _frame: Any) -> None:
            self.stderr.write(f"signal {signum}: finishing the current cycle")
            daemon.stop.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write(f"scheduler {daemon.lease.holder} on the {options['backend']} backend")
        daemon.run()
