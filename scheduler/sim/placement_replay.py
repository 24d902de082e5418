"""Arrival-only placement replay through the engine's placer (fragmentation studies).

The openb protocol (place requests one at a time, no departures, skip what fits nowhere)
needs no queue, quota or clock, only the placer and its scoring plugins. The fragmentation
mix is learned online: each request is observed when it arrives, before it is placed.
CPU-only pods take a GPU node's CPU and memory as the protocol (and FGD's paper) does,
without the profile's ``cpu_only_share`` kept for jobs with GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

from scheduler.core import Profile
from scheduler.core.cycle import build_context
from scheduler.core.scoring import FragmentationScore
from scheduler.core.types import JobRequest, Node, PriorityClass, Resources, Snapshot, Tenant

_ANYONE = Tenant("replay")
_UNCHARGED = PriorityClass("replay", 0, may_preempt=False, counts_against_quota=False)


def replay_placements(
    nodes: Sequence[Node],
    requests: Iterable[tuple[Resources, tuple[str, ...]]],
    profile: Profile,
) -> Iterator[tuple[str, str] | None]:
    """For each (resources, allowed flavors), in order: (node, flavor) where it was placed,
    or None when it fit nowhere. Placements stay (no departures)."""
    snapshot = Snapshot(0.0, tuple(nodes), (_ANYONE,), (_UNCHARGED,))
    ctx = build_context(snapshot, replace(profile, cpu_only_share=1.0))
    scorers = [s for s, _ in ctx.placer.scorers if isinstance(s, FragmentationScore)]
    every_flavor = tuple(ctx.state.flavor_names)
    for k, (resources, flavors) in enumerate(requests):
        for scorer in scorers:
            scorer.observe(resources, flavors)
        job = JobRequest(f"r{k}", _ANYONE.name, _UNCHARGED.name, resources, flavors=flavors)
        found = ctx.try_place_any(job, flavors or every_flavor, (0,), avoid_reserved=False)
        yield None if found is None else (found[1][0].node, found[0])
