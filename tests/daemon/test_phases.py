"""Whether the next cycle should follow at once (`scheduler.daemon.phases.go_again`)."""

from __future__ import annotations

import pytest

from scheduler.daemon.phases import CycleStats, go_again


@pytest.mark.parametrize(
    ("fields", "again"),
    [
        ({"placed": 3, "gpu_left": 8000}, True),  # jobs behind those placed may take the rest
        ({"placed": 3, "gpu_left": None}, True),  # the engine held no base to tell
        ({"placed": 3, "gpu_left": 0}, False),  # nothing left but by preemption
        ({"preempted": 1}, True),
        ({"bind_failed": 1, "gpu_left": 0}, True),  # its devices are free again
        ({"reconciled": 5, "released": 5, "gpu_left": 0}, False),  # this cycle saw them
        ({"started": 7, "gpu_left": 8000}, False),  # a start frees nothing
        ({"gpu_left": 8000}, False),  # nothing placed: the next cycle would see the same
    ],
)
def test_the_next_cycle_follows_at_once_only_when_it_may_decide_more(
    fields: dict[str, int | None], again: bool
) -> None:
    assert go_again(CycleStats(1, 1, **fields)) is again  # type: ignore[arg-type]
