"""What a simulation replays: a cluster, jobs arriving over time, failures and node outages.

Pure data. Times are virtual seconds from the start of the replay.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.types import JobRequest, Node, PriorityClass, Tenant


@dataclass(frozen=True, slots=True)
class WorkloadJob:
    """One job of the workload. ``request.submitted_at`` is replaced by ``submitted_at``,
    or by ``arrival_s`` when that is None (the job was submitted when it arrived).

    ``duration_s`` is the work it needs (wall time with all replicas). Its first ``failures``
    attempts fail ``fail_after_s`` seconds after they start (then it retries with backoff).
    """

    request: JobRequest
    arrival_s: float
    duration_s: float
    failures: int = 0
    fail_after_s: float = 0.0
    submitted_at: float | None = None


@dataclass(frozen=True, slots=True)
class NodeOutage:
    """``node`` fails at ``at_s`` (its jobs are requeued elsewhere) and heals after
    ``duration_s``."""

    node: str
    at_s: float
    duration_s: float


@dataclass(frozen=True, slots=True)
class Cluster:
    nodes: tuple[Node, ...]
    tenants: tuple[Tenant, ...]
    priority_classes: tuple[PriorityClass, ...]


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Replay settings.

    - ``retry_base_s`` / ``retry_max_s``: backoff after a failed attempt, doubling from base.
    - ``max_attempts``: attempts (first run included) before a failing job is given up.
    - ``checkpoint_interval_s``: checkpointable jobs keep progress up to their last
      checkpoint when stopped; others restart from zero.
    - ``tick_s``: a cycle at least this often while jobs wait (aging, backoff, min runtime),
      besides the cycles that follow every arrival, completion and outage.
    - ``horizon_s``: stop there even if jobs remain (None: run until all are done).
    - ``cycle_latency_s``: how long a cycle takes. Its decisions take effect that much
      after the snapshot it decided on, and no other cycle runs meanwhile: what ends or
      arrives during a cycle waits for the next one (a daemon's latency; 0: instant).
    """

    retry_base_s: float = 10.0
    retry_max_s: float = 600.0
    max_attempts: int = 5
    checkpoint_interval_s: float = 600.0
    tick_s: float = 60.0
    horizon_s: float | None = None
    cycle_latency_s: float = 0.0
