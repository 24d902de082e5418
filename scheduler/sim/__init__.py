"""Discrete-event replay of a workload on virtual time through ``scheduler.core.run_cycle``.

A library: ``simulate(workload, cluster, profile, outages=..., config=...) -> SimReport``,
``estimate_starts(snapshot, profile)`` for wait-time estimates from the present, and
``replay_placements(nodes, requests, profile)`` for arrival-only fragmentation studies.
"""

from scheduler.sim.engine import Simulation, StartState, simulate
from scheduler.sim.estimate import StartEstimates, estimate_starts, estimate_starts_within
from scheduler.sim.measures import JobOutcome, Percentiles, SimReport
from scheduler.sim.placement_replay import replay_placements
from scheduler.sim.workload import Cluster, NodeOutage, SimConfig, WorkloadJob

__all__ = [
    "Cluster",
    "JobOutcome",
    "NodeOutage",
    "Percentiles",
    "SimConfig",
    "SimReport",
    "Simulation",
    "StartEstimates",
    "StartState",
    "WorkloadJob",
    "estimate_starts",
    "estimate_starts_within",
    "replay_placements",
    "simulate",
]
