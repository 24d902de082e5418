"""Jobs and their event history. Nodes, devices and allocations join them with the daemon."""

from scheduler.models.allocations import Allocation as Allocation
from scheduler.models.allocations import AllocationDevice as AllocationDevice
from scheduler.models.clusters import Cluster as Cluster
from scheduler.models.clusters import ClusterBackendKind as ClusterBackendKind
from scheduler.models.clusters import ClusterState as ClusterState
from scheduler.models.daemon import SchedulerLease as SchedulerLease
from scheduler.models.daemon import SchedulingProfileRecord as SchedulingProfileRecord
from scheduler.models.jobs import FINAL_STATES as FINAL_STATES
from scheduler.models.jobs import HOLDING_STATES as HOLDING_STATES
from scheduler.models.jobs import Job as Job
from scheduler.models.jobs import JobEvent as JobEvent
from scheduler.models.jobs import JobQueueEstimate as JobQueueEstimate
from scheduler.models.jobs import JobState as JobState
from scheduler.models.nodes import GpuDevice as GpuDevice
from scheduler.models.nodes import Node as Node
from scheduler.models.nodes import NodeAgent as NodeAgent
from scheduler.models.tallies import EventTally as EventTally
from scheduler.models.tallies import EventTallyMark as EventTallyMark
from scheduler.models.utilization import JobIdle as JobIdle
from scheduler.models.utilization import QueueSnapshot as QueueSnapshot
from scheduler.models.utilization import RollupPeriod as RollupPeriod
from scheduler.models.utilization import RollupScope as RollupScope
from scheduler.models.utilization import RollupWatermark as RollupWatermark
from scheduler.models.utilization import UtilizationRollup as UtilizationRollup
from scheduler.models.utilization import UtilizationSample as UtilizationSample
from scheduler.models.xids import XidEvent as XidEvent
