"""`manage.py run_workload_controller`: queue what users create in Kubernetes (issue 37).

Runs as the gantry-workload-controller Deployment (platform/k8s/25-workload-controller.yaml),
with the Kubernetes credentials of KUBECONFIG or the pod's service account and the database
of the web: each pass mirrors the pods Gantry's webhook held into Gantry jobs, cancels the jobs
of deleted ones and writes what Gantry decided as events on them
(scheduler/workloads/controller.py, docs/kubernetes-native.md). A pass that fails (the API
server or the database away) is logged and tried again at the next interval; nothing is
changed on a failed read. SIGTERM or SIGINT ends it after the current pass.

The loop reads the held objects from watches (scheduler/workloads/watched.py): a pass lists
nothing while nothing changes, a change seen by a watch starts the next pass at once, and each
kind is listed again every `--relist` seconds (what a broken watch missed). A pass queues new
workloads for `--queueing-budget` seconds at most, then the next pass starts at once: a burst
is queued over several passes, and a higher class created meanwhile goes before the burst's
lower ones. `--once` lists.

    manage.py run_workload_controller                # a pass every 2 s, or at a change
    manage.py run_workload_controller --interval 5
    manage.py run_workload_controller --once         # one pass, then exit (its stats printed)
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from scheduler.backends.base import BackendError
from scheduler.workloads.controller import QUEUEING_BUDGET_S, WorkloadController
from scheduler.workloads.watched import WatchedHeld

logger = logging.getLogger("gantry.workloads")


class Command(BaseCommand):
    help = "Queue the pods users create in Kubernetes through Gantry, and tell them why they wait."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--interval", type=float, default=2.0, help="Seconds between passes.")
        parser.add_argument("--once", action="store_true", help="One pass, then exit.")
        parser.add_argument(
            "--relist",
            type=float,
            default=60.0,
            help="Seconds between lists of each kind (the watches keep it current between).",
        )
        parser.add_argument(
            "--queueing-budget",
            type=float,
            default=QUEUEING_BUDGET_S,
            help="Seconds a pass spends queueing new workloads before the next pass lists again.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        interval, budget = options["interval"], options["queueing_budget"]
        if not 0.1 <= budget <= 3600:
            raise CommandError("--queueing-budget must be from 0.1 to 3600 seconds")
        if not 0.1 <= interval <= 3600:
            raise CommandError("--interval must be from 0.1 to 3600 seconds")
        if not 1 <= options["relist"] <= 86400:
            raise CommandError("--relist must be from 1 to 86400 seconds")
        from kubernetes.config import ConfigException

        from scheduler.backends.kubernetes.backend import from_environment

        try:
            backend = from_environment()
        except (ConfigException, OSError) as error:
            raise CommandError(f"the cluster's credentials could not be loaded: {error}") from error
        if options["once"]:
            # one pass queues every workload it lists: no next pass to leave any to
            controller = WorkloadController(
                backend, gpu_resource=backend.config.gpu_resource, queueing_budget_s=math.inf
            )
            stats = controller.sync()
            self.stdout.write(
                f"listed {stats.listed} held pods: {stats.mirrored} queued, {stats.refused} "
                f"refused, {stats.cancelled} cancelled, {stats.events} events written"
            )
            return
        watched = WatchedHeld(backend, relist_s=options["relist"])
        controller = WorkloadController(
            watched,
            gpu_resource=backend.config.gpu_resource,
            queueing_budget_s=budget,
            background_tells=True,
        )
        stop = threading.Event()

        def stopping(*_: Any) -> None:
            stop.set()
            watched.changed.set()  # the wait below ends at once

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stopping)
        logger.info("workload controller started: a pass every %.1fs or at a change", interval)
        try:
            self._loop(controller, watched, stop, interval)
        finally:
            controller.close()  # the tells under way are written
            watched.close()
        logger.info("workload controller stopped")

    @staticmethod
    def _loop(
        controller: WorkloadController, watched: WatchedHeld, stop: threading.Event, interval: float
    ) -> None:
        while not stop.is_set():
            watched.changed.clear()  # a change from here on starts the next pass at once
            try:
                stats = controller.sync()
            except (BackendError, DatabaseError) as error:
                logger.warning("pass failed, tried again in %.1fs: %s", interval, error)
                stop.wait(interval)  # not sooner, however many changes come meanwhile
                continue
            else:
                if stats.mirrored or stats.cancelled or stats.refused:
                    logger.info(
                        "%d queued, %d refused, %d cancelled, %d left for the next pass",
                        stats.mirrored,
                        stats.refused,
                        stats.cancelled,
                        stats.deferred,
                    )
                if stats.deferred:
                    continue  # the pass's queueing budget was spent: the next one at once
            watched.changed.wait(interval)
