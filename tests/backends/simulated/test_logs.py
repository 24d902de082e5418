"""The simulated cluster's logs: deterministic per pod, believable per job type, read by tail
or by cursor, followed with an injected clock."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from scheduler.backends.base import LogSource, LogTarget
from scheduler.backends.simulated.logs import PAGE_LINES, SimulatedLogs, sim_log

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def target(job_type: str = "training", **changes: object) -> LogTarget:
    base = LogTarget("team-a", "gantry-7-a0-r0", 7, 0, 0, job_type, T0, None)
    return replace(base, **changes)  # type: ignore[arg-type]


def texts(page: object) -> list[str]:
    return [line.text for line in page.lines]  # type: ignore[attr-defined]


def test_same_pod_same_time_same_lines() -> None:
    now = T0 + timedelta(hours=1)
    assert sim_log(target(), now=now, tail=50) == sim_log(target(), now=now, tail=50)


def test_another_replica_or_attempt_writes_other_numbers() -> None:
    now = T0 + timedelta(hours=1)
    lines = texts(sim_log(target(), now=now, tail=20))
    assert texts(sim_log(target(replica=1), now=now, tail=20)) != lines
    assert texts(sim_log(target(attempt=1), now=now, tail=20)) != lines


def test_training_loss_falls_and_checkpoints_are_saved() -> None:
    page = sim_log(target(), now=T0 + timedelta(hours=3), tail=PAGE_LINES)
    losses = [float(m[1]) for t in texts(page) if (m := re.search(r"loss (\d+\.\d+)", t))]
    assert losses[0] > losses[-1] + 0.5
    assert any("saved checkpoint" in t for t in texts(page))
    assert any("samples/s" in t for t in texts(page))


def test_nothing_is_written_before_the_pod_starts() -> None:
    page = sim_log(target(), now=T0 - timedelta(seconds=5), tail=10)
    assert page.lines == ()
    assert page.cursor == "0"


def test_the_prologue_comes_out_as_time_passes() -> None:
    # Training's opening lines are at 0, 2, 4, 6 and 8 s: by 5 s, three of them.
    page = sim_log(target(), now=T0 + timedelta(seconds=5), tail=10)
    assert texts(page) == [
        "Loading dataset shards from /data ...",
        "Initialising process group: backend=nccl",
        "NCCL INFO Bootstrap : Using eth0",
    ]


@pytest.mark.parametrize(
    ("outcome", "last_words"),
    [
        ("failed", "RuntimeError: NCCL error"),
        ("oom", "torch.OutOfMemoryError: CUDA out of memory"),
        ("stopped", "Received SIGTERM"),
        ("succeeded", "Finished"),
    ],
)
def test_an_ended_pod_says_how_it_ended(outcome: str, last_words: str) -> None:
    ended = target(ended_at=T0 + timedelta(minutes=30), outcome=outcome)
    page = sim_log(ended, now=T0 + timedelta(hours=2), tail=8)
    assert any(t.startswith(last_words) for t in texts(page))
    assert page.lines[-1].at == T0 + timedelta(minutes=30)
    # Nothing is written after the end.
    later = sim_log(ended, now=T0 + timedelta(days=3), tail=8)
    assert later == page


@pytest.mark.parametrize(
    ("job_type", "marker"),
    [
        ("inference", "requests in the last 60s"),
        ("interactive", "[I ServerApp]"),
        ("batch", "examples/s"),
        ("evaluation", "examples/s"),
    ],
)
def test_each_job_type_prints_its_own_lines(job_type: str, marker: str) -> None:
    page = sim_log(target(job_type), now=T0 + timedelta(hours=2), tail=5)
    assert len(page.lines) == 5
    assert all(marker in t for t in texts(page)[-3:])


def test_reading_by_cursor_gives_every_line_once() -> None:
    now = T0 + timedelta(minutes=20)
    whole = texts(sim_log(target(), now=now, tail=PAGE_LINES))
    first = sim_log(target(), now=T0 + timedelta(minutes=7), tail=PAGE_LINES)
    rest = sim_log(target(), now=now, cursor=first.cursor)
    assert texts(first) + texts(rest) == whole
    assert sim_log(target(), now=now, cursor=rest.cursor).lines == ()


def test_a_long_running_pod_is_read_a_page_at_a_time() -> None:
    now = T0 + timedelta(days=30)  # inference: a line a minute, 43,000 of them
    page = sim_log(target("inference"), now=now, cursor="0")
    assert len(page.lines) == PAGE_LINES
    assert page.cursor == str(PAGE_LINES)


@pytest.mark.parametrize("cursor", ["-3", "abc", "1e9", "9" * 20])
def test_a_cursor_this_log_did_not_write_is_refused(cursor: str) -> None:
    with pytest.raises(ValueError, match="not a log cursor"):
        sim_log(target(), now=T0 + timedelta(hours=1), cursor=cursor)


class Clock:
    """Time that moves only when the follower sleeps."""

    def __init__(self, at: datetime) -> None:
        self.at = at
        self.slept: list[float] = []

    def now(self) -> datetime:
        return self.at

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.at += timedelta(seconds=seconds)


def test_following_yields_new_lines_and_stops_when_the_pod_ends() -> None:
    clock = Clock(T0 + timedelta(minutes=2))
    ended = target(ended_at=T0 + timedelta(minutes=4), outcome="succeeded")
    logs = SimulatedLogs(clock=clock.now, sleep=clock.sleep, poll_s=10.0)
    followed = [line.text for line in logs.follow_log(ended, tail=3)]
    whole = texts(sim_log(ended, now=T0 + timedelta(hours=1), tail=PAGE_LINES))
    assert followed == whole[-len(followed) :]
    assert followed[-1] == "exit code 0"
    assert clock.slept and set(clock.slept) == {10.0}


def test_the_simulated_logs_are_a_log_source() -> None:
    assert isinstance(SimulatedLogs(), LogSource)
