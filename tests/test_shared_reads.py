"""common/db/shared_reads: a batch's reads of what it does not change are made once."""

from __future__ import annotations

from typing import Any

from common.db.shared_reads import shared, shared_reads

calls: list[tuple[Any, ...]] = []


@shared
def read(key: Any, *, scale: int = 1) -> list[Any]:
    calls.append((key, scale))
    return [key, scale]


def setup_function() -> None:
    calls.clear()


def test_outside_a_block_every_call_reads() -> None:
    read("a")
    read("a")
    assert calls == [("a", 1), ("a", 1)]


def test_inside_a_block_each_set_of_arguments_reads_once() -> None:
    with shared_reads():
        first = read("a")
        assert read("a") is first
        read("a", scale=2)
        read("b")
        read("a", scale=2)
    assert calls == [("a", 1), ("a", 2), ("b", 1)]
    read("a")  # the block ended: nothing kept
    assert calls[-1] == ("a", 1) and len(calls) == 4


def test_unhashable_arguments_are_read_each_time() -> None:
    with shared_reads():
        read(["a"])
        read(["a"])
    assert calls == [(["a"], 1), (["a"], 1)]


def test_a_nested_block_shares_the_outer_ones_answers_and_ends_with_it() -> None:
    with shared_reads():
        read("a")
        with shared_reads():
            read("a")
        read("a")
    assert calls == [("a", 1)]
