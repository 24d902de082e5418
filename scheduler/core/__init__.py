"""The pure scheduling engine: ``run_cycle(snapshot, profile) -> CycleResult``.

No Django, no I/O, no clock: frozen dataclasses in (``types``), frozen dataclasses out.
"""

from scheduler.core.cycle import queue_order, run_cycle
from scheduler.core.order import decay_usage
from scheduler.core.profile import Profile, ProfileError

__all__ = ["Profile", "ProfileError", "decay_usage", "queue_order", "run_cycle"]
