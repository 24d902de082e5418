"""bench/daemon_setup.py's `apart`: what the benchmarks run beside the daemon (the simulated
kubelets, the nodes' heartbeats) runs in a process of its own, so that it never takes the
daemon's interpreter lock, and its result comes back when the block ends."""

from __future__ import annotations

import os
from typing import Any

from bench.daemon_setup import apart


def _until_stopped(stop: Any) -> tuple[int, bool]:
    return os.getpid(), stop.wait(30)


def _fails(stop: Any) -> None:
    raise RuntimeError("the child's play failed")


def test_the_play_runs_in_another_process_until_the_block_ends_and_its_result_comes_back() -> None:
    with apart(_until_stopped) as results:
        assert results == []  # nothing yet: it runs until the block ends
    [(pid, stopped)] = results
    assert pid != os.getpid()
    assert stopped is True  # it was told to stop, not timed out


def test_a_play_that_fails_answers_none_and_the_block_ends() -> None:
    with apart(_fails, wait_s=30) as results:
        pass
    assert results == [None]
