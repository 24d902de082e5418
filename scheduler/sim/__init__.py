"""Discrete-event replay of a workload on virtual time through ``scheduler.core.run_cycle``.

A library: ``simulate(workload, cluster, profile, outages=..., config=...) -> SimReport``.
"""

from scheduler.sim.engine import Simulation, simulate
from scheduler.sim.report import JobOutcome, Percentiles, SimReport
from scheduler.sim.workload import Cluster, NodeOutage, SimConfig, WorkloadJob

__all__ = [
    "Cluster",
    "JobOutcome",
    "NodeOutage",
    "Percentiles",
    "SimConfig",
    "SimReport",
    "Simulation",
    "WorkloadJob",
    "simulate",
]
