"""The chaos benchmark's lost cluster (`python -m bench.chaos --lose-cluster`).

A second simulated cluster (`site-b`, the home's hardware) beside the home one: the schedulers
drive both through the federation (docs/multicluster.md), and the load lands on either. During
the run, a few long jobs that prefer site-b run there; then site-b stops answering (every API
call of the schedulers stalls, then fails: `PersistentCluster.lose`) for longer than its
deadline (`lost_after_s`) and the node-lost grace together, while its pods run on; then it
answers again, still running the stale attempts' pods. A sampler reads both clusters as they
are (an observer, through the outage) every second.

Counts (the JSON's `lose_cluster`; those of `MUST_BE_ZERO` must be 0):

- `ran_on_two_clusters`: jobs with Running pods in both clusters at a sampled moment outside
  the outage and the time the federation takes to see site-b again and stop what it runs
  there (`heal_allowance_s`);
- `ran_on_two_clusters_during_outage`: the same while site-b was silent, or being stopped
  after: the design's known window (a partitioned cluster runs on, and nothing outside it can
  stop it), reported, not a failure;
- `requeued_before_deadline`: jobs that ran on site-b when it went silent whose next attempt
  started before its deadline: `lost_after_s` after its last answer (`last_seen_at`, in the
  daemon's clock as the attempts' starts are), the jobs held until then;
- `not_requeued_after_deadline`: jobs that ran on site-b when it went silent, neither final
  nor on another attempt once the deadline, the grace and `hold_allowance_s` had passed;
- `charged_beyond_hold`: those jobs' allocations on site-b still open (charged) past the
  same moment;
- `cluster_not_marked_lost` (site-b never read `lost`) and `cluster_not_active_after` (not
  `active` again at the end);
- `stale_pods_at_heal`: pods of attempts no longer current that site-b still ran when it came
  back (above 0: the scenario exercised what it is for), and `long_jobs_on_site_b`.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from bench.chaos.faults import Monitor
from bench.chaos.load import TEAMS

OTHER = "site-b"
MUST_BE_ZERO = (
    "ran_on_two_clusters",
    "requeued_before_deadline",
    "not_requeued_after_deadline",
    "charged_beyond_hold",
    "cluster_not_marked_lost",
    "cluster_not_active_after",
)
SAMPLE_EVERY_S = 1.0
# Past the deadline and the grace: the federation asks a silent cluster again only every
# PROBE_EVERY_S (10 s), each ask stalling `stall_s`, and a cycle or two decides.
HOLD_SLACK_S = 15.0


def add_cluster(lost_after_s: int) -> None:
    """site-b's row (Django set up): the schedulers federate the clusters when they start."""
    from scheduler.models import Cluster

    Cluster.objects.create(
        name=OTHER, backend="simulated", lost_after_s=lost_after_s, labels={"site": "b"}
    )


def open_other(state_file: Any, nodes_csv: Any) -> Any:
    """site-b as it is (an observer: through its outage); its state file is the one
    `scheduler.clusters.backends.member_backend` gives it."""
    from scheduler.backends.simulated.inventory import nodes_from_openb_csv
    from scheduler.backends.simulated.statefile import PersistentCluster

    path = state_file.with_name(f"{state_file.name}.{OTHER}")
    return PersistentCluster(nodes_from_openb_csv(nodes_csv), path, observer=True)


def long_job(index: int, duration_s: float) -> dict[str, Any]:
    """A job that prefers site-b and outlives its outage: a whole GPU, or a gang of two."""
    replicas = 2 if index % 2 else 1
    return {
        "name": f"chaos-site-b-{index}",
        "type": "training" if replicas > 1 else "batch",
        "image": "chaos/job:1",
        "command": ["run"],
        "replicas": replicas,
        "resources": {"gpus": 1},
        "priority_class": "normal",
        "placement": {"preferred_clusters": [OTHER]},
        "simulation": {"duration_s": round(duration_s)},
    }


@dataclass
class LostCluster:
    """The scenario: `run(...)` in a thread at the loss's moment; `sampler` meanwhile."""

    home: Any
    other: Any
    url: str
    lost_after_s: float
    grace_s: float
    down_s: float
    stall_s: float
    long_jobs: int = 3
    stop: threading.Event = field(default_factory=threading.Event)
    counts: dict[str, Any] = field(default_factory=dict)
    held: list[tuple[int, int, int]] = field(default_factory=list)  # (allocation, job, attempt)
    lost_at: Any = None  # the database's clock
    last_seen: Any = None  # site-b's last answer before the outage, as the daemon recorded it
    window: tuple[float, float] | None = None  # (lost, healed), monotonic
    twice: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    states: set[str] = field(default_factory=set)

    @property
    def hold_s(self) -> float:
        return self.lost_after_s + self.grace_s + HOLD_SLACK_S

    @property
    def heal_allowance_s(self) -> float:
        return 10.0 + self.stall_s + 10.0  # the federation's next ask, a cycle, the delete

    def route(self, node: str) -> tuple[Any, str]:
        """The cluster holding qualified node `node`, and its name there."""
        cluster, _, local = node.rpartition(":")
        return (self.other, local) if cluster == OTHER else (self.home, node)

    # --- the loss ---------------------------------------------------------------------------

    def run(self, run: Any) -> None:
        """1. long jobs onto site-b; 2. it goes silent past its deadline; 3. the jobs held
        there must have moved; 4. it answers again, with what it still runs."""
        monitor = Monitor(self.url)
        self._submit_long_jobs(run, monitor)
        self.held = [
            (allocation, job, attempt)
            for allocation, job, attempt in monitor.query(
                "SELECT a.id, a.job_id, a.attempt FROM scheduler_allocation a"
                " JOIN scheduler_node n ON n.id = a.node_id"
                " WHERE a.ended_at IS NULL AND n.name LIKE %s",
                [f"{OTHER}:%"],
            )
        ]
        self.lost_at = monitor.query("SELECT clock_timestamp()")[0][0]
        self.other.lose(self.stall_s)
        began = time.monotonic()
        time.sleep(self.down_s)
        self.counts["not_requeued_after_deadline"] = self._not_requeued(monitor)
        self.counts["stale_pods_at_heal"] = self._stale_pods(monitor)
        self.last_seen = monitor.query(
            "SELECT last_seen_at FROM scheduler_cluster WHERE name = %s", [OTHER]
        )[0][0]
        self.window = (began, time.monotonic())  # before: no sample between reads as answering
        self.other.restore()
        monitor.connection and monitor.connection.close()

    def _submit_long_jobs(self, run: Any, monitor: Monitor) -> None:
        ids = []
        for index in range(self.long_jobs):
            token, project = run.teams[TEAMS[index % len(TEAMS)]]
            body = {"project": project, "spec": long_job(index, self.down_s + 40)}
            job = run.submit(token, body, key=f"chaos-site-b-{index}")
            ids += [job] if job is not None else []
        deadline = time.monotonic() + 60.0
        on_b: list[tuple[Any, ...]] = []
        while time.monotonic() < deadline:
            on_b = monitor.query(
                "SELECT DISTINCT a.job_id FROM scheduler_allocation a"
                " JOIN scheduler_node n ON n.id = a.node_id JOIN scheduler_job j ON j.id = a.job_id"
                " WHERE a.ended_at IS NULL AND j.state = 'running' AND n.name LIKE %s"
                " AND a.job_id = ANY(%s)",
                [f"{OTHER}:%", ids],
            )
            if len(on_b) == len(ids):
                break
            time.sleep(1.0)
        self.counts["long_jobs_on_site_b"] = len(on_b)

    def _not_requeued(self, monitor: Monitor) -> int:
        if not self.held:
            return 0
        rows = monitor.query(
            "SELECT count(DISTINCT j.id) FROM scheduler_job j"
            " JOIN unnest(%s::int[], %s::int[]) AS h(job, attempt) ON h.job = j.id"
            " WHERE j.attempt = h.attempt"
            " AND j.state NOT IN ('succeeded', 'failed', 'cancelled', 'rejected')",
            [[job for _, job, _ in self.held], [attempt for _, _, attempt in self.held]],
        )
        return int(rows[0][0])

    def _stale_pods(self, monitor: Monitor) -> int:
        current = {
            (job, attempt)
            for job, attempt in monitor.query(
                "SELECT id, attempt FROM scheduler_job WHERE state NOT IN"
                " ('succeeded', 'failed', 'cancelled', 'rejected')"
            )
        }
        return sum(
            1
            for pod in self.other.list_pods()
            if pod.phase == "Running" and (pod.job_id, pod.attempt) not in current
        )

    # --- the sampler ------------------------------------------------------------------------

    def sampler(self, url: str) -> None:
        """Every second until `stop`: which jobs run in both clusters, and site-b's state."""
        monitor = Monitor(url)
        while not self.stop.wait(SAMPLE_EVERY_S):
            self.sample()
            self.states |= {
                row[0]
                for row in monitor.query(
                    "SELECT state FROM scheduler_cluster WHERE name = %s", [OTHER]
                )
            }
        monitor.connection and monitor.connection.close()

    def sample(self) -> None:
        """The jobs with Running pods (stopping or not: their containers run) in both
        clusters now, under the moment's phase."""
        where: dict[int, set[str]] = defaultdict(set)
        for name, cluster in (("home", self.home), (OTHER, self.other)):
            for pod in cluster.list_pods():
                if pod.phase == "Running":
                    where[pod.job_id].add(name)
        both = {job for job, clusters in where.items() if len(clusters) > 1}
        self.twice[self._phase()] |= both

    def _phase(self) -> str:
        now = time.monotonic()
        if self.other.path.with_suffix(self.other.path.suffix + ".unreachable").exists():
            return "outage"
        if self.window is not None and now < self.window[1] + self.heal_allowance_s:
            return "outage"
        return "answering"

    def _requeued_early(self, monitor: Monitor) -> int:
        deadline_from = self.last_seen or self.lost_at
        if not self.held or deadline_from is None:
            return 0
        rows = monitor.query(
            "SELECT count(DISTINCT a.job_id) FROM scheduler_allocation a"
            " JOIN unnest(%s::int[], %s::int[]) AS h(job, attempt) ON h.job = a.job_id"
            " WHERE a.attempt > h.attempt AND a.started_at < %s + make_interval(secs => %s)",
            [
                [job for _, job, _ in self.held],
                [attempt for _, _, attempt in self.held],
                deadline_from,
                self.lost_after_s,
            ],
        )
        return int(rows[0][0])

    def results(self, monitor: Monitor) -> dict[str, Any]:
        """The section's counts, once the run settled (schedulers stopped)."""
        charged = 0
        if self.held and self.lost_at is not None:
            charged = monitor.query(
                "SELECT count(*) FROM scheduler_allocation WHERE id = ANY(%s)"
                " AND (ended_at IS NULL OR ended_at > %s + make_interval(secs => %s))",
                [[a for a, _, _ in self.held], self.lost_at, self.hold_s],
            )[0][0]
        state = monitor.query("SELECT state FROM scheduler_cluster WHERE name = %s", [OTHER])
        return {
            "requeued_before_deadline": self._requeued_early(monitor),
            **self.counts,
            "ran_on_two_clusters": len(self.twice["answering"]),
            "ran_on_two_clusters_during_outage": len(self.twice["outage"]),
            "charged_beyond_hold": int(charged),
            "cluster_not_marked_lost": int("lost" not in self.states),
            "cluster_not_active_after": int(not state or state[0][0] != "active"),
            "held_at_loss": len({job for _, job, _ in self.held}),
            "params": {
                "lost_after_s": self.lost_after_s,
                "node_lost_grace_s": self.grace_s,
                "down_s": self.down_s,
                "stall_s": self.stall_s,
                "hold_s": self.hold_s,
                "heal_allowance_s": self.heal_allowance_s,
            },
        }
