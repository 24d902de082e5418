"""Phase 1, order: jobs within their tenant's guarantee first (with the profile's
``guaranteed_first``), then priority class (with aging), then fair share, then age.

Fair share of a tenant = ((1 - w) * dominant share now + w * historical share) / weight, where
the dominant share is the largest usage / guarantee over its flavors, the historical share
is its decayed GPU usage over what its full guarantee would have used in the same window,
and ``w`` is the profile's ``history_weight``. The queue is a heap of tenants keyed by their
head job, re-keyed after every job is handled, so a tenant admitted in this cycle falls
behind tenants that got less (volcano's proportion/drf, applied within one cycle).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence

from scheduler.core.profile import Profile
from scheduler.core.types import MILLI_PER_GPU, JobRequest, PriorityClass


def decay_usage(
    previous: Mapping[str, float],
    usage_milli: Mapping[str, int],
    elapsed_s: float,
    half_life_s: float,
) -> dict[str, float]:
    """Historical usage after ``elapsed_s`` more seconds at constant ``usage_milli``.

    Exact for piecewise-constant usage: the old value decays by 2^(-dt/h) and the new
    interval adds u * h/ln2 * (1 - 2^(-dt/h)), the integral of u decayed to the end.
    """
    factor = 2.0 ** (-elapsed_s / half_life_s)
    gain = half_life_s / math.log(2) * (1.0 - factor)
    tenants = set(previous) | set(usage_milli)
    return {t: previous.get(t, 0.0) * factor + usage_milli.get(t, 0) * gain for t in tenants}


def effective_priority(
    job: JobRequest, classes: Mapping[str, PriorityClass], now: float, profile: Profile
) -> float:
    """Class value plus aging: ``aging_per_hour`` points per hour waited, capped at the max
    boost. Whole points only: a continuous boost would order every class by age alone and
    fair share would never get a say among jobs of one class."""
    pc = classes.get(job.priority_class)
    base = pc.value if pc is not None else 0
    waited_h = max(0.0, now - job.submitted_at) / 3600.0
    return base + min(profile.aging_max_boost, math.floor(profile.aging_per_hour * waited_h))


def fair_share(
    current: float, decayed: float, total_guarantee: int, weight: float, profile: Profile
) -> float:
    """See the module docstring; ``current`` is the dominant share now."""
    window = max(total_guarantee, MILLI_PER_GPU) * profile.half_life_s / math.log(2)
    mixed = (1 - profile.history_weight) * current + profile.history_weight * decayed / window
    return mixed / max(weight, 1e-9)


def ordered_jobs(
    jobs: Sequence[JobRequest],
    priority: Callable[[JobRequest], float],
    share: Callable[[str], float],
    borrows: Callable[[JobRequest], bool] = lambda _job: False,
) -> Iterator[JobRequest]:
    """Yield jobs best first. Each tenant's queue is in priority, then age order; the
    tenants' heads compete on (``borrows(head)``, priority, ``share(tenant)``, age), read
    each time the tenant is re-queued, i.e. after the consumer handled its previous job."""
    queues: dict[str, deque[tuple[float, float, str, int]]] = defaultdict(deque)
    for key in sorted((-priority(j), j.submitted_at, j.id, i) for i, j in enumerate(jobs)):
        queues[jobs[key[3]].tenant].append(key)

    def head(tenant: str) -> tuple[bool, float, float, float, str, str]:
        neg_priority, submitted, job_id, index = queues[tenant][0]
        return (borrows(jobs[index]), neg_priority, share(tenant), submitted, job_id, tenant)

    heap = [head(tenant) for tenant in queues]
    heapq.heapify(heap)
    while heap:
        tenant = heapq.heappop(heap)[-1]
        queue = queues[tenant]
        yield jobs[queue.popleft()[3]]
        if queue:
            heapq.heappush(heap, head(tenant))
