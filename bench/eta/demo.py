"""`python -m bench.eta --demo`: the estimates against the actual starts on the demo load.

The demo organisation (`scheduler.demo.seed.seed_demo`: acme's teams, quotas, users, projects and
approval policies) on the demo's simulated cluster (`inventory.demo_nodes`), fed by the demo's
own load generator (`DemoLoad`, after every cycle as `run_scheduler` runs it), scheduled by the
daemon on wall-clock time with its estimates refreshed by its own path (`EtaRefresher`), for
`minutes`; the recorder of bench.eta.daemon records every estimate and the naive baseline.

The demo's jobs run minutes (30 s to 15 min); `speed` divides their durations, their max
runtimes and the generator's period (at 10, the default, a pretraining of 4-15 min runs 24-90
s), as `--stretch` scales the Kueue trace. The seeded jobs of `seed_demo` (600 s runs of an
hour-long scale) are cancelled first: the load alone is measured. A job's runtime is drawn
uniformly within its template's range, so the template (user, project, type) predicts it no
better than that range.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

from bench.eta.daemon import WORKER_READY_S, note_refresh
from scheduler.core import Profile
from scheduler.sim.arrivals import LATE_WINDOWS

DEMO_EVERY_S = 15.0  # run_scheduler's --demo-every


def scaled_templates(speed: float) -> list[Any]:
    """The demo load's templates with their durations divided by `speed` (whole seconds,
    at least 1: the spec's unit)."""
    from scheduler.demo.load import TEMPLATES

    out = []
    for user, project, name, kind, replicas, gpus, flavor, (low, high), extra in TEMPLATES:
        span = (max(1, round(low / speed)), max(1, round(high / speed)))
        out.append((user, project, name, kind, replicas, gpus, flavor, span, extra))
    return out


def run(
    profile: Profile,
    *,
    minutes: float,
    speed: float,
    seed: int,
    every_s: float,
    budget_s: float,
    max_jobs: int,
    history_every_s: float,
    poll_s: float,
    interval_s: float,
    calibrate: bool,
    workdir: Path,
    arrivals_window_s: float = 0.0,
    arrivals_max: int = 200,
    arrivals_late_windows: float = LATE_WINDOWS,
    split: bool = False,
) -> dict[str, Any]:
    """The demo load through the daemon on the database Django is set up on (it must be
    empty). Returns bench.eta.daemon's figures."""
    from django.conf import settings
    from django.db import connections

    from bench.eta import Estimate
    from bench.eta.daemon import _figures, recorder
    from scheduler.backends.simulated.cluster import SimulatedCluster
    from scheduler.backends.simulated.inventory import demo_nodes
    from scheduler.daemon.loop import Daemon
    from scheduler.demo.load import DemoLoad
    from scheduler.demo.seed import seed_demo
    from scheduler.estimates.refresh import EtaRefresher, EtaSettings
    from scheduler.jobs.services import job_cancel
    from scheduler.leader import Lease
    from scheduler.models import FINAL_STATES, Job

    seed_demo()
    for job in Job.objects.exclude(state__in=FINAL_STATES):
        job_cancel(user=job.submitted_by, job=job, reason="bench.eta --demo: the load alone")
    backend = SimulatedCluster(demo_nodes(), start_delay_s=0.0, grace_cap_s=0.0)
    load = DemoLoad(
        time.time, every_s=DEMO_EVERY_S / speed, seed=seed, templates=scaled_templates(speed)
    )
    config = EtaSettings(
        every_s,
        budget_s,
        max_jobs,
        settings.GANTRY_ETA_UNBOUNDED_RUNTIME_S,
        calibrate,
        arrivals_window_s=arrivals_window_s,
        arrivals_max=arrivals_max,
        arrivals_late_windows=arrivals_late_windows,
    )
    refreshes: list[dict[str, Any]] = []
    estimated: set[tuple[int, float]] = set()  # (job, estimated_at) per the daemon's refreshes
    cycles = 0
    start = time.time()

    def on_cycle(d: Daemon) -> None:
        nonlocal cycles
        cycles += 1
        load.tick(d)
        note_refresh(d, refreshes, estimated)
        if time.time() - start >= minutes * 60:
            d.stop.set()

    daemon = Daemon(
        backend,
        lease=Lease(ttl_s=60),
        profile=profile,
        interval_s=interval_s,
        max_pending=100_000,
        per_queue=0,
        sync_every_s=min(1.0, interval_s),
        on_cycle=on_cycle,
    )
    daemon.estimates = EtaRefresher(config=config, history_every_s=history_every_s)
    daemon.lease.acquire()
    daemon.sync_nodes(force=True)
    if connections["default"].vendor == "postgresql":
        # the daemon's loop refreshes in a worker there: its start (seconds under load) is
        # not the estimates' to pay, so the replay's clock starts with it set up
        daemon.estimates.start_background()
        daemon.estimates.wait_ready(WORKER_READY_S)
    connections.close_all()  # the forked recorder opens its own
    stop = multiprocessing.get_context("fork").Event()
    recorded = workdir / "estimates.json"
    recording = multiprocessing.get_context("fork").Process(
        target=recorder, args=(recorded, poll_s, stop, profile, max_jobs), daemon=True
    )
    recording.start()
    try:
        daemon.run()
    finally:
        stop.set()
        recording.join()
    seen = json.loads(recorded.read_text())
    estimates = [Estimate(str(job), at, p50, p90) for job, at, p50, p90 in seen["estimates"]]
    naive = [Estimate(str(job), at, p50, p90) for job, at, p50, p90 in seen["naive"]]
    submitted = Job.objects.filter(created_at__gte=_dt(start)).count()
    load_figures = {"submitted_by_load": load.count, "speed": speed, "minutes": minutes}
    return load_figures | _figures(
        estimates,
        naive,
        jobs=submitted,
        wall_s=time.time() - start,
        cycles=cycles,
        refreshes=refreshes,
        refreshes_seen=seen["refreshes_seen"],
        unrecorded=len(estimated - {(int(e.job), e.at) for e in estimates}),
        split=split,
    )


def _dt(at: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, tz=UTC)
