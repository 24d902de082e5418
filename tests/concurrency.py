"""Forcing interleavings: run calls in threads, each with its own database connection."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection


def run_in_threads(*calls: Callable[[], Any]) -> list[tuple[str, Any]]:
    """Run each call in its own thread; ("ok", result) or ("error", exception) per call.

    Each thread closes its connection when done, so the test database can be flushed.
    """
    results: list[tuple[str, Any]] = [("pending", None)] * len(calls)

    def runner(index: int, call: Callable[[], Any]) -> None:
        try:
            results[index] = ("ok", call())
        except Exception as exc:
            results[index] = ("error", exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=runner, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return results


def rendezvous(parties: int) -> Callable[[], None]:
    """A meeting point for `parties` threads that forces an interleaving: each waits there
    until all have arrived. On SQLite a transaction takes the database's write lock when it
    begins (IMMEDIATE), so a second writer cannot reach a point inside its transaction
    until the first has committed: that interleaving cannot happen there, and a thread
    that waited in vain (a short timeout) carries on. On PostgreSQL all must arrive."""
    serialised = connection.vendor == "sqlite"
    barrier = threading.Barrier(parties, timeout=1.0 if serialised else 10.0)

    def meet() -> None:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            if not serialised:
                raise

    return meet
