"""Expected arrivals: the jobs likely to be submitted while the queue waits, from the recent past.

A start estimate that replays only the present assumes nothing else arrives; on a busy
cluster later jobs of higher priority, or of a tenant under its fair share, go ahead of
those waiting. The arrival process is read from the jobs submitted lately, per stream of
alike jobs (``Shape``: tenant, priority class, milli-GPU per replica, replicas, flavors):

- a stream with at least ``min_count`` submissions in the window ``(now - window_s, now]``
  has a gap: the span from its first to its last submission over the gaps between them
  (a burst at one instant: the window over the count);
- a stream whose last submission is more than ``STALE_GAPS`` gaps old has stopped (a
  batch of submissions that is over: expecting more would delay every estimate);
- a live stream is expected again at its last submission plus 1, 2, ... gaps (evenly
  spaced, never random, so an estimate is deterministic), as copies of its latest job
  (``ExpectedArrival.like`` names it: the runtime model judges the copy by it).

``expected_arrivals`` keeps those within ``lookahead_s`` of now, the first ``max_count`` of
them in time order: every one is a job more for the replay to carry.

``expected_ranges`` gives the two replays of a start range their own arrivals: the p50's
those of the window, the p90's those of ``LATE_WINDOWS`` windows (streams read over a longer
past and continued as far ahead), the later start that more arrivals make likely. A short
window alone leaves the range too narrow on the side of late starts; a long one alone moves
the p50 later than most jobs start (a stream kept alive past its end, docs/queue-estimates.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from scheduler.core.types import JobRequest

Shape = tuple[str, str, int, int, tuple[str, ...]]

# A stream is over once this many of its gaps passed without a submission: by then a
# periodic or Poisson source (P = e^-2 ~ 0.14) would most likely have submitted again.
STALE_GAPS = 2.0

# The p90 replay's arrivals are read and continued over this many of the p50's windows.
LATE_WINDOWS = 3.0


def shape(job: JobRequest) -> Shape:
    """The stream a job belongs to: tenant, priority class, milli-GPU per replica,
    replicas, flavors."""
    return (job.tenant, job.priority_class, job.resources.gpu_milli, job.replicas, job.flavors)


@dataclass(frozen=True, slots=True)
class Stream:
    """Alike jobs submitted at a steady pace: ``template`` the latest of them (submitted at
    ``last_s``), one every ``gap_s`` seconds."""

    template: JobRequest
    last_s: float
    gap_s: float


@dataclass(frozen=True, slots=True)
class ExpectedArrival:
    """A job expected at ``at_s``: a copy of the job ``like`` (its stream's latest), under
    an id of its own, submitted then."""

    job: JobRequest
    at_s: float
    like: str


def arrival_streams(
    submitted: Iterable[JobRequest], now: float, *, window_s: float, min_count: int = 2
) -> tuple[Stream, ...]:
    """The live streams of the jobs ``submitted`` (by their ``submitted_at``) within
    ``window_s`` before ``now``; older or later submissions are ignored. Ordered by the
    template's id (deterministic whatever the input's order)."""
    recent: dict[Shape, list[JobRequest]] = defaultdict(list)
    for job in submitted:
        if now - window_s < job.submitted_at <= now:
            recent[shape(job)].append(job)
    streams = []
    for jobs in recent.values():
        if len(jobs) < max(1, min_count):
            continue
        jobs.sort(key=lambda j: (j.submitted_at, j.id))
        first, last = jobs[0].submitted_at, jobs[-1].submitted_at
        gap = (last - first) / (len(jobs) - 1) if last > first else window_s / len(jobs)
        if now - last > STALE_GAPS * gap:
            continue
        streams.append(Stream(jobs[-1], last, gap))
    return tuple(sorted(streams, key=lambda s: s.template.id))


def expected_arrivals(
    streams: Sequence[Stream], now: float, *, lookahead_s: float, max_count: int
) -> tuple[ExpectedArrival, ...]:
    """The streams' next submissions after ``now`` and up to ``now + lookahead_s``, the
    first ``max_count`` in time order (ties by id)."""
    found: list[ExpectedArrival] = []
    for stream in streams:
        if stream.gap_s <= 0:
            continue
        first = max(1, int((now - stream.last_s) // stream.gap_s) + 1)  # the first after now
        for k in range(first, first + max(0, max_count)):  # each stream's first max_count
            at = stream.last_s + k * stream.gap_s
            if at > now + lookahead_s:
                break
            template = stream.template
            job = replace(
                template, id=f"{template.id}~{k}", submitted_at=at, not_before=0.0, attempt=0
            )
            found.append(ExpectedArrival(job, at, template.id))
    found.sort(key=lambda a: (a.at_s, a.job.id))
    return tuple(found[: max(0, max_count)])


@dataclass(frozen=True, slots=True)
class ExpectedRanges:
    """The arrivals each replay of a start range expects: ``p50`` within the window, ``p90``
    within ``LATE_WINDOWS`` of them (``expected_ranges``)."""

    p50: tuple[ExpectedArrival, ...]
    p90: tuple[ExpectedArrival, ...]

    @property
    def templates(self) -> set[str]:
        """The ids of the jobs the arrivals are like (their runtime groups are needed)."""
        return {a.like for a in (*self.p50, *self.p90)}


def expected_ranges(
    submitted: Iterable[JobRequest],
    now: float,
    *,
    window_s: float,
    max_count: int,
    late_windows: float = LATE_WINDOWS,
) -> ExpectedRanges:
    """The p50 replay's arrivals: the streams of the last ``window_s`` continued as far
    ahead; the p90's: those of ``late_windows`` times as long, continued as far (at least
    the window: ``late_windows`` under 1 counts as 1). Each at most ``max_count``."""
    jobs = list(submitted)
    early = arrival_streams(jobs, now, window_s=window_s)
    p50 = expected_arrivals(early, now, lookahead_s=window_s, max_count=max_count)
    late_s = window_s * max(1.0, late_windows)
    if late_s == window_s:
        return ExpectedRanges(p50, p50)
    late = arrival_streams(jobs, now, window_s=late_s)
    return ExpectedRanges(
        p50, expected_arrivals(late, now, lookahead_s=late_s, max_count=max_count)
    )
