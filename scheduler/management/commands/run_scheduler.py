"""`manage.py run_scheduler`: the scheduler daemon (one leader, any number of standbys).

    manage.py run_scheduler                       # simulated cluster of the demo inventory
    manage.py run_scheduler --nodes-csv PATH      # simulated cluster of an openb node list
    manage.py run_scheduler --backend kubernetes  # the cluster of KUBECONFIG / in-cluster
    manage.py run_scheduler --no-demo-load        # no generated jobs
    manage.py run_scheduler --profile FILE        # a scheduling profile (YAML; reloaded on change)
    manage.py run_scheduler --metrics-port 9402   # serve the cycles' series on /metrics

With several Cluster rows (docs/multicluster.md) the backend named is the home cluster's, and
the daemon drives every cluster's through one `FederatedBackend`.

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

from scheduler.backends.federated import FederatedBackend
from scheduler.clusters.backends import ClusterWatch, backend_for_clusters
from scheduler.core import ProfileError
from scheduler.daemon.loop import Daemon
from scheduler.daemon.schema_guard import SchemaGuardedLease
from scheduler.metrics.cycles import CycleMetrics
from scheduler.profiles.files import ProfileWatch
from scheduler.profiles.record import profile_record_loaded, profile_record_refused


def make_backend(kind: str, nodes_csv: Path | None) -> Any:
    if kind == "simulated":
        from scheduler.backends.simulated.cluster import SimulatedCluster
        from scheduler.backends.simulated.inventory import demo_nodes, nodes_from_openb_csv

        nodes = nodes_from_openb_csv(nodes_csv) if nodes_csv else demo_nodes()
        if not settings.GANTRY_SIM_STATE_FILE:
            return SimulatedCluster(nodes)
        from scheduler.backends.simulated.statefile import PersistentCluster

        # Its pods outlive this process, as a real cluster's do: a restarted (or standby)
        # scheduler finds them running.
        return PersistentCluster(nodes, Path(settings.GANTRY_SIM_STATE_FILE))
    if kind == "kubernetes":
        try:
            module = importlib.import_module("scheduler.backends.kubernetes.backend")
        except ImportError as error:
            raise CommandError(f"the kubernetes backend is not available: {error}") from error
        factory = getattr(module, "from_environment", None) or module.KubernetesBackend
        return factory()
    raise CommandError(f"unknown backend {kind!r} (simulated or kubernetes)")


def profile_watch(path: str | None, *, holder: str) -> ProfileWatch:
    """The profile in force, recorded for platform admins (and audited) whenever the daemon
    takes the lead or the file changes. A file that cannot be used stops the start, with
    every problem in it; once running, a bad new content is refused and the profile kept."""
    try:
        return ProfileWatch(
            path,
            on_loaded=lambda loaded: profile_record_loaded(loaded=loaded, holder=holder),
            on_refused=lambda path, sha, errors: profile_record_refused(
                path=path, sha256=sha, errors=errors
            ),
        )
    except OSError as error:
        raise CommandError(f"profile {path}: cannot be read: {error.strerror or error}") from error
    except ProfileError as error:
        lines = "\n".join(f"  {where}: {message}" for where, message in error.errors)
        raise CommandError(f"profile {path} is not valid:\n{lines}") from error


class Command(BaseCommand):
    help = "Run the scheduler daemon."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--backend", default=settings.GANTRY_CLUSTER_BACKEND)
        parser.add_argument("--nodes-csv", type=Path, default=None)
        parser.add_argument("--interval", type=float, default=settings.GANTRY_SCHEDULER_INTERVAL_S)
        parser.add_argument(
            "--profile",
            default=settings.GANTRY_SCHEDULER_PROFILE or None,
            help="scheduling profile file (YAML; default GANTRY_SCHEDULER_PROFILE, else the "
            "built-in defaults); reloaded when it changes",
        )
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
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=0,
            help="serve the cycles' duration histogram on /metrics at this port (0: do not)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # Never leads on a schema a later release contracted (docs/upgrading.md).
        lease = SchemaGuardedLease(ttl_s=options["lease_ttl"])
        watch = profile_watch(options["profile"], holder=lease.holder)  # before any backend
        home = make_backend(options["backend"], options["nodes_csv"])
        # Several Cluster rows: every cluster's backend behind one (docs/multicluster.md).
        backend = backend_for_clusters(home)
        if not 0 <= options["metrics_port"] <= 65535:
            raise CommandError("--metrics-port must be 0 (off) or a port number")
        cycles = CycleMetrics()
        hooks: list[Any] = [cycles.on_cycle]
        on_lead: dict[str, Any] = {}
        if isinstance(backend, FederatedBackend):
            cluster_watch = ClusterWatch(backend)
            hooks.append(cluster_watch.tick)
            on_lead["leading"] = cluster_watch.on_lead
        if options["backend"] == "simulated" and not options["no_demo_load"]:
            from scheduler.demo.load import DemoLoad

            hooks.append(DemoLoad(home.clock, every_s=options["demo_every"]).tick)

        def on_cycle(daemon: Daemon) -> None:
            for hook in hooks:
                hook(daemon)

        daemon = Daemon(
            backend,
            lease=lease,
            profile_watch=watch,
            interval_s=options["interval"],
            on_cycle=on_cycle,
            sync_every_s=min(1.0, options["interval"]),
            per_queue=options["per_queue"],
            hooks=on_lead,
            watch_held=True,
        )

        def stop(signum: int, _frame: Any) -> None:
            self.stderr.write(f"signal {signum}: finishing the current cycle")
            daemon.stop.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write(f"scheduler {daemon.lease.holder} on the {options['backend']} backend")
        self.stdout.write(watch.current.describe())
        server = cycles.serve(options["metrics_port"]) if options["metrics_port"] else None
        try:
            daemon.run()
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()
