"""Where a flavor's idle reserved capacity lies when the installation has several clusters
(issue 38). Pure: no Django, no I/O.

The split of an hour (billing/metering/capacity.py) is made per flavor across every cluster:
the quota tree, and so each holder's unused guarantee, is global. Each holder's idle share is
then located on the clusters its guarantee lies on:

1. The part of its guarantee pinned to a cluster lies on that cluster.
2. The rest, its floating guarantee (the global one less its pins), is apportioned over the
   clusters in proportion to their available devices of the flavor in the hour, in whole
   milli-GPUs by the largest remainder method, so that the parts add up to it exactly
   (`apportion_int`). An hour with no available device of the flavor anywhere uses the
   devices present instead.
3. The share is divided over the clusters in proportion to the guarantee located on each:
   exact fractions, which add up to the share exactly.
4. A cluster cannot hold more idle reserved than it had idle (a pin whose cluster was busy,
   its guarantee lent, sits where the idle devices were): what a cluster holds beyond its
   idle is taken from its holders in proportion to their shares there and moved to the
   clusters with idle left, in proportion to what each has left (`fit_idle`). The flavor's
   idle reserved is at most its idle, so the room suffices; each holder's total is kept.

With one cluster, every part lies on it: the shares, and so each tenant's total, are the
flavor's split unchanged.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from fractions import Fraction
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def apportion_int(total: int, weights: Mapping[K, int]) -> dict[K, int]:
    """`total` (>= 0) in integer parts proportional to `weights` (>= 0, not all 0), adding up
    to `total` exactly: each part is its exact share rounded down, and what is left goes one
    each to the largest remainders (ties: the order of `weights`). A key of weight 0 gets 0."""
    whole = sum(weights.values())
    if total < 0 or whole <= 0 or any(w < 0 for w in weights.values()):
        raise ValueError(f"cannot apportion {total} over weights {dict(weights)}")
    floors = {key: total * w // whole for key, w in weights.items()}
    left = total - sum(floors.values())
    order = sorted(weights, key=lambda key: -(total * weights[key] % whole))
    for key in order[:left]:
        floors[key] += 1
    return floors


def guarantee_by_cluster(
    *, pins: Mapping[str, int], floating: int, devices: Mapping[str, int]
) -> dict[str, int]:
    """A holder's guarantee (milli-GPU) per cluster: its pins where they are, its floating
    part apportioned over `devices` (the clusters' device counts, at least one positive
    when `floating` is). Adds up to sum(pins) + floating exactly."""
    located = {cluster: milli for cluster, milli in pins.items() if milli}
    if floating:
        for cluster, milli in apportion_int(floating, devices).items():
            if milli:
                located[cluster] = located.get(cluster, 0) + milli
    return located


def locate_share(share: Fraction, guarantee: Mapping[str, int]) -> dict[str, Fraction]:
    """`share` divided over the clusters in proportion to the guarantee located on each (a
    positive total); the parts add up to `share` exactly."""
    whole = sum(guarantee.values())
    return {cluster: share * milli / whole for cluster, milli in guarantee.items() if milli}


def fit_idle(
    located: Mapping[str, Mapping[int, Fraction]], idle: Mapping[str, Fraction]
) -> dict[str, dict[int, Fraction]]:
    """`located` (cluster -> holder -> share) with no cluster above its `idle` (step 4):
    the excess of each cluster taken from its holders pro rata, and each holder's excess
    spread over the clusters with room, in proportion to the room. Each holder's total is
    kept exactly; a cluster within its idle loses nothing. The shares must add up to at
    most the clusters' idle (the split's idle reserved is at most its idle)."""
    reserved = {c: sum(shares.values(), Fraction(0)) for c, shares in located.items()}
    over = {c: r - idle.get(c, Fraction(0)) for c, r in reserved.items()}
    if all(excess <= 0 for excess in over.values()):
        return {c: dict(shares) for c, shares in located.items()}
    room = {c: idle[c] - reserved.get(c, Fraction(0)) for c in idle}
    room = {c: left for c, left in room.items() if left > 0}
    total_room = sum(room.values(), Fraction(0))
    fitted: dict[str, dict[int, Fraction]] = {}
    moved: dict[int, Fraction] = {}
    for cluster, shares in located.items():
        excess = over[cluster]
        if excess <= 0:
            fitted[cluster] = dict(shares)
            continue
        keep = 1 - excess / reserved[cluster]
        fitted[cluster] = {t: share * keep for t, share in shares.items() if share * keep}
        for tenant, share in shares.items():
            moved[tenant] = moved.get(tenant, Fraction(0)) + share - share * keep
    for cluster, left in room.items():
        into = fitted.setdefault(cluster, {})
        for tenant, amount in moved.items():
            into[tenant] = into.get(tenant, Fraction(0)) + amount * left / total_room
    return fitted
