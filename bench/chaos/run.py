"""The chaos benchmark's run: its services, processes and counters, the faults that touch the
cluster, Redis and the API, the settling, and the final checks (bench.chaos.checks)."""

from __future__ import annotations

import collections
import contextlib
import os
import random
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos.env import PgCluster, Proc, RedisServer
from bench.chaos.faults import Monitor, Schedulers
from bench.chaos.load import TEAMS, Api, Portal

FINAL = ("succeeded", "failed", "cancelled", "rejected")


@dataclass
class Run:
    root: Path
    pg: PgCluster
    redis: RedisServer
    monitor: Monitor = field(init=False)
    schedulers: Schedulers = field(init=False)
    others: list[Proc] = field(default_factory=list)
    api: Api = field(init=False)
    cluster: Any = None
    other: Any = None  # the cluster lost during the run (--lose-cluster), as it is
    loss: Any = None  # its scenario (bench.chaos.clusters.LostCluster)
    nodes: list[str] = field(default_factory=list)
    teams: dict[str, tuple[str, int]] = field(default_factory=dict)
    started: float = 0.0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    freezes: list[dict[str, Any]] = field(default_factory=list)
    restart: dict[str, Any] = field(default_factory=dict)
    acknowledged: dict[int, str] = field(default_factory=dict)  # job id -> its owner's token
    submit_failures: int = 0
    api_errors: int = 0
    redis_down: bool = False
    redis_down_requests: int = 0
    api_errors_redis_down: int = 0
    redis_window: tuple[Any, Any] | None = None  # the outage in the database's clock
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def state_file(self) -> Path:
        return self.root / "cluster.state"

    @property
    def nodes_csv(self) -> Path:
        return self.root / "nodes.csv"

    def setup_django(self, env: dict[str, str]) -> None:
        """Django in this process on the run's database (seeding, checks), migrated."""
        self.monitor = Monitor(self.pg.url)
        for key in ("DATABASE_URL", "REDIS_URL", "GANTRY_VAR_DIR", "GANTRY_SIM_STATE_FILE"):
            os.environ[key] = env[key]
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        os.environ["DJANGO_DEBUG"] = "0"
        os.environ["GANTRY_LOG_LEVEL"] = "WARNING"
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def open_cluster(self) -> None:
        """The simulated cluster's shared state, as the schedulers see it (faults go there)."""
        from scheduler.backends.simulated.inventory import nodes_from_openb_csv
        from scheduler.backends.simulated.statefile import PersistentCluster

        self.cluster = PersistentCluster(nodes_from_openb_csv(self.nodes_csv), self.state_file)

    def clusters(self) -> list[Any]:
        return [self.cluster] + ([self.other] if self.other is not None else [])

    def route(self, node: str) -> tuple[Any, str]:
        """The cluster holding qualified node `node`, and its name there."""
        return (self.cluster, node) if self.loss is None else self.loss.route(node)

    def wait_ready(self, nodes: int, wait_s: float = 180.0) -> None:
        """Until the web server answers and a leader has written the cluster's nodes."""
        deadline = time.monotonic() + wait_s
        token = next(iter(self.teams.values()))[0]
        while time.monotonic() < deadline:
            count = self.monitor.query("SELECT count(*) FROM scheduler_node WHERE present")[0][0]
            if count >= nodes and self.api.call("GET", "/api/v1/jobs/", token)[0] == 200:
                return
            time.sleep(1.0)
        raise RuntimeError(f"the platform did not come up within {wait_s} s: see {self.root}/logs")

    # --- the API ------------------------------------------------------------------------------

    def _count(self, status: int) -> None:
        """A 503 (the database restarting: retry) is no error, but any 5xx while only Redis
        is down is one."""
        with self.lock:
            if status == 0 or (status >= 500 and status != 503):
                self.api_errors += 1
            if self.redis_down:
                self.redis_down_requests += 1
                self.api_errors_redis_down += status == 0 or status >= 500

    def submit(self, token: str, body: dict[str, Any], key: str) -> int | None:
        """The job's id once the API accepted it, repeating the request with the same key
        through errors (a restarting database) for up to a minute."""
        for _ in range(60):
            status, answer = self.api.call("POST", "/api/v1/jobs/", token, body, key=key)
            self._count(status)
            if status in (200, 201):
                self.acknowledged[answer["id"]] = token
                return int(answer["id"])
            if 400 <= status < 500 and status != 429:
                self.submit_failures += 1
                self.faults["submit_refused"] += 1
                print(f"chaos: submission {key} refused: {status} {str(answer)[:300]}")
                return None
            time.sleep(1.0)
        self.submit_failures += 1
        return None

    def read(self, token: str, job_id: int) -> None:
        status, _ = self.api.call("GET", f"/api/v1/jobs/{job_id}/", token)
        self._count(status)

    # --- faults outside the schedulers ----------------------------------------------------------

    def redis_outage(self, seconds: float) -> None:
        """Redis stops for `seconds`; submissions and reads go on meanwhile, through the API
        (the submitter's and this thread's) and the portal (a session opened before, a login
        during, the job list and pages, and the job form, whose job is cancelled after)."""
        slug = TEAMS[0]
        token, project = self.teams[slug]
        portal, newcomer = Portal(self.api.base), Portal(self.api.base)
        portal.login(f"chaos-{slug}")
        began = self.monitor.query("SELECT clock_timestamp()")[0][0]
        self.redis.stop()
        self.redis_down = True
        deadline = time.monotonic() + seconds
        self._count(newcomer.login(f"chaos-{slug}"))
        status, made = portal.submit(project, "chaos-portal-redis-down", key="chaos-portal")
        self._count(status if made is not None else 0)
        while time.monotonic() < deadline:
            status, _ = self.api.call("GET", "/api/v1/jobs/?page_size=5", token)
            self._count(status)
            self._count(portal.get("/jobs/"))
            if made is not None:
                self._count(portal.get(f"/jobs/{made}/"))
                self._count(newcomer.get(f"/jobs/{made}/"))
            if self.acknowledged:
                job = next(reversed(self.acknowledged))
                self.read(self.acknowledged[job], job)
            time.sleep(2.0)
        self.redis_down = False
        self.redis.start()
        self.redis_window = (began, self.monitor.query("SELECT clock_timestamp()")[0][0])
        self.faults["redis_down_s"] = round(seconds)
        if made is not None:
            self.acknowledged[made] = token
            self.api.call("POST", f"/api/v1/jobs/{made}/cancel/", token, {"reason": "chaos"})

    def fail_nodes(self, *, share: float, down_s: float) -> None:
        rng = random.Random(len(self.nodes))
        failed = rng.sample(self.nodes, max(1, round(share * len(self.nodes))))
        for node in failed:
            self.cluster.fail_node(node)
        self.faults["nodes_failed"] += len(failed)
        time.sleep(down_s)
        for node in failed:
            self.cluster.heal_node(node)

    def hang_terminating(self, *, down_s: float) -> None:
        """A node stops reporting (partitioned) and the jobs running there are cancelled: their
        pods hang in Terminating until the node heals or the daemon gives up on it."""
        deadline = time.monotonic() + 60.0
        busy: list[Any] = []
        while not busy and time.monotonic() < deadline:
            busy = self.monitor.query(
                "SELECT n.name, array_agg(DISTINCT a.job_id) FROM scheduler_allocation a"
                " JOIN scheduler_node n ON n.id = a.node_id JOIN scheduler_job j ON j.id = a.job_id"
                " WHERE a.ended_at IS NULL AND j.state = 'running'"
                " GROUP BY n.name ORDER BY count(*) DESC LIMIT 1"
            )
            time.sleep(0.5)
        if not busy:
            self.faults["terminating_skipped"] += 1
            return
        node, jobs = busy[0]
        cluster, local = self.route(node)
        cluster.partition_node(local)
        owners = {
            job: team
            for job, team in self.monitor.query(
                "SELECT j.id, t.slug FROM scheduler_job j"
                " JOIN tenants_tenant t ON t.id = j.tenant_id WHERE j.id = ANY(%s)",
                [jobs],
            )
        }
        for job in jobs:
            token = self.teams[owners[job]][0]
            status, _ = self.api.call(
                "POST", f"/api/v1/jobs/{job}/cancel/", token, {"reason": "chaos"}
            )
            self._count(status)
            self.faults["pods_terminating_hung"] += status == 200
        self.faults["nodes_partitioned"] += 1
        time.sleep(down_s)
        cluster.heal_node(local)

    def shutdown(self, *, keep: bool) -> None:
        with contextlib.suppress(AttributeError):
            for proc in self.schedulers.procs:
                proc.stop()
        for proc in self.others:
            proc.stop()
        self.redis.stop()
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        if self.monitor.connection is not None:
            with contextlib.suppress(Exception):
                self.monitor.connection.close()
        self.pg.stop()
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)


# Allocations on their way out: their job final or on another attempt, or marked to stop. Each
# keeps its devices until its pod is really gone (docs/faults.md 17), a cycle or a grace
# period after the job's end; the checks read the history at rest, once none is left.
STOPPING_SQL = (
    "SELECT count(*) FROM scheduler_allocation a JOIN scheduler_job j ON j.id = a.job_id"
    " WHERE a.ended_at IS NULL"
    " AND (j.state = ANY(%s) OR a.attempt <> j.attempt OR a.end_reason <> '')"
)


def outage_pending(run: Run) -> int:
    """The notifications written while Redis was down that are still to send: their task could
    not be queued, and the beat's sweep (every 30 s) hands them to the worker once Redis is
    back. celery_catch_up counts those never sent."""
    if run.redis_window is None:
        return 0
    count: int = run.monitor.query(
        "SELECT count(*) FROM tenants_notification WHERE state = 'pending'"
        " AND created_at BETWEEN %s AND %s",
        list(run.redis_window),
    )[0][0]
    return count


def settle(run: Run, wait_s: float) -> bool:
    """Until every job is final, every allocation of theirs has ended and the Redis outage's
    notifications are sent (True), or `wait_s` passed (False: the checks then count what is
    left). Without the last, a run that settled before the beat's next sweep counted its
    notifications as not caught up (celery_not_caught_up), by the clock, not by a fault."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        left = run.monitor.query(
            "SELECT count(*) FROM scheduler_job WHERE NOT state = ANY(%s)", [list(FINAL)]
        )[0][0]
        if (
            not left
            and not run.monitor.query(STOPPING_SQL, [list(FINAL)])[0][0]
            and not outage_pending(run)
        ):
            return True
        time.sleep(2.0)
    return False


def checks(run: Run) -> dict[str, Any]:
    """Stop the schedulers (nothing moves while the history is read), list the cluster's
    pods, and run the checks. Returns the JSON's body."""
    died = [proc.name for proc in run.others if not proc.alive()]
    for proc in run.schedulers.procs:
        proc.stop()
    if run.loss is not None:
        run.loss.stop.set()
    pods = [pod.name for cluster in run.clusters() for pod in cluster.list_pods()]
    from django.db import connections

    connections.close_all()
    from bench.chaos.checks import quota_peaks, run_checks

    counts = run_checks(pods=pods, submitted=list(run.acknowledged))
    known = {row[0] for row in run.monitor.query("SELECT id FROM scheduler_job")}
    missing = [job for job in run.acknowledged if job not in known]
    stale = run.monitor.query("SELECT count(*) FROM chaos_stale_write")[0][0]
    out: dict[str, Any] = dict(counts)
    out |= {
        "checks": dict(counts),
        "quota_peaks": quota_peaks(),
        "kills": run.faults["kills"],
        "faults": dict(run.faults),
        "freezes": run.freezes,
        "stale_writes": stale,
        "restart": run.restart,
        "restart_lost_running": run.restart.get("restart_lost_running", 0),
        "submitted": len(run.acknowledged),
        "submit_failures": run.submit_failures,
        "acknowledged_missing": len(missing),
        "api": {"by_status": run.api.counts, "errors": run.api_errors},
        "api_errors_redis_down": run.api_errors_redis_down,
        "requests_redis_down": run.redis_down_requests,
        "schedulers_started": run.schedulers.started,
        # The web server, the worker and beat must outlive every fault (nothing restarts them).
        "processes_died": len(died),
        "died": died,
    }
    out |= celery_catch_up(run)
    if run.loss is not None:
        out["lose_cluster"] = run.loss.results(run.monitor)
    return out


def celery_catch_up(run: Run) -> dict[str, Any]:
    """The notifications written while Redis was down: sent afterwards by the worker."""
    if run.redis_window is None:
        return {"celery_not_caught_up": 0}
    began, ended = run.redis_window
    rows = run.monitor.query(
        "SELECT state, count(*), count(*) FILTER (WHERE sent_at > %s) FROM tenants_notification"
        " WHERE created_at BETWEEN %s AND %s GROUP BY state",
        [ended, began, ended],
    )
    states = {state: count for state, count, _ in rows}
    late = sum(sent_late for _, _, sent_late in rows)
    return {
        "celery_during_outage": states,
        "celery_sent_late": late,
        "celery_not_caught_up": states.get("pending", 0) + states.get("failed", 0),
    }
