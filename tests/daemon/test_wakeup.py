"""The daemon's waiter: a backend's pod event ends a wait at once, on PostgreSQL (beside
LISTEN) and without it (polling); with no event the wait runs to its timeout."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from scheduler.daemon.wakeup import Waiter


def set_later(event: threading.Event, after_s: float) -> None:
    threading.Timer(after_s, event.set).start()


@pytest.mark.parametrize("listen", [True, False], ids=["listen", "poll"])
def test_a_backend_event_ends_the_wait(transactional_db: Any, listen: bool) -> None:
    wake = threading.Event()
    waiter = Waiter(wake=wake)
    waiter.listen = listen and waiter.listen
    try:
        assert waiter.wait(0.05) == "timeout"
        set_later(wake, 0.1)
        started = time.monotonic()
        assert waiter.wait(10.0) == "backend"
        assert time.monotonic() - started < 2.0
        assert not wake.is_set()  # taken: the next wait waits again
        assert waiter.wait(0.05) == "timeout"
        wake.set()  # set while the daemon was busy: the next wait returns at once
        assert waiter.wait(10.0) == "backend"
    finally:
        waiter.close()


@pytest.mark.postgresql("LISTEN/NOTIFY")
def test_notifications_wake_the_waiter_within_a_slice_once(transactional_db: Any) -> None:
    """A NOTIFY ends the wait by the end of the current slice (half a second), not at the
    wait's end, and the ones sent with it do not wake it again."""
    waiter = Waiter()
    try:
        assert waiter.wait(0.05) == "timeout"  # listening from here
        threading.Timer(0.1, notify_twice).start()
        started = time.monotonic()
        assert waiter.wait(10.0) == "notify"
        assert time.monotonic() - started < 2.0
        assert waiter.wait(0.6) == "timeout"  # the second one came with the first
    finally:
        waiter.close()


def notify_twice() -> None:
    import psycopg
    from django.db import connection

    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "server_side_binding"):
        params.pop(key, None)
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute("NOTIFY gantry_scheduler, 'a'; NOTIFY gantry_scheduler, 'b'")


def test_stop_still_ends_a_wait_with_a_backend_event(transactional_db: Any) -> None:
    stop = threading.Event()
    waiter = Waiter(stop, wake=threading.Event())
    try:
        set_later(stop, 0.1)
        started = time.monotonic()
        assert waiter.wait(10.0) == "stop"
        assert time.monotonic() - started < 2.0
    finally:
        waiter.close()
