"""How the daemon waits between cycles: LISTEN/NOTIFY on PostgreSQL, a plain sleep otherwise.

The triggers of migration 0003 NOTIFY `gantry_scheduler` when a job is queued or cancelled
and when an allocation ends. The listening connection is separate from Django's (it must
stay outside transactions). When it breaks, silently or not, the waiter still returns at the
timeout (the polling fallback) and reconnects on the next wait.

A NOTIFY is acted on at the end of the wait's current slice (at most 0.5 s later, with any
others sent meanwhile), or sooner at the wait's timeout (the simulated cluster's next pod
event). A backend that watches its pods (Kubernetes: `watch_pods`) hands the waiter an event
it sets when they change; the waiter then looks at it every `WAKE_SLICE_S` (and slices are
that long), so a pod's change is acted on at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from django.db import connection

log = logging.getLogger("gantry.daemon")
CHANNEL = "gantry_scheduler"
WAKE_SLICE_S = 0.05  # how often a wait looks at the backend's event


class Waiter:
    def __init__(
        self, stop: threading.Event | None = None, wake: threading.Event | None = None
    ) -> None:
        self.stop = stop or threading.Event()
        self.wake = wake
        self.listen = connection.vendor == "postgresql"
        self._conn: Any = None

    def _connect(self) -> Any:
        import psycopg

        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        params.pop("server_side_binding", None)
        conn = psycopg.connect(**params, autocommit=True)
        conn.execute(f"LISTEN {CHANNEL}")
        return conn

    def backend_pid(self) -> int | None:
        return self._conn.info.backend_pid if self._conn is not None else None

    def wait(self, timeout_s: float) -> str:
        """Block until a notification, the backend's event, `stop`, or the timeout. Returns
        "notify", "backend", "stop", "timeout" or "error" (the listener broke; it reconnects
        next time)."""
        if timeout_s <= 0:
            return "timeout"
        # Short slices so that SIGTERM (the stop event) and the backend's event are
        # honoured promptly.
        slice_s = min(timeout_s, 0.5 if self.wake is None else WAKE_SLICE_S)
        if not self.listen:
            if self.wake is None:
                return "stop" if self.stop.wait(timeout_s) else "timeout"
            waited = 0.0
            while waited < timeout_s:
                if self._woken():
                    return "backend"
                if self.stop.wait(min(slice_s, timeout_s - waited)):
                    return "stop"
                waited += slice_s
            return "backend" if self._woken() else "timeout"
        try:
            if self._conn is None:
                self._conn = self._connect()
            waited = 0.0
            while waited < timeout_s:
                if self.stop.is_set():
                    return "stop"
                if self._woken():
                    return "backend"
                # Notifications are batched by the slice: psycopg returns at the slice's
                # end unless 50 came. Jobs arrive one by one; a cycle for each would keep
                # the daemon busy when pods end (and a pod's end frees GPUs): waking at
                # once (stop_after=1) made bench.kueue_e2e slower (bench/history.md,
                # kueue_e2e, 2026-12-03 05:14-06:20).
                got = list(
                    self._conn.notifies(timeout=min(slice_s, timeout_s - waited), stop_after=50)
                )
                if got:
                    return "notify"
                waited += slice_s
            return "backend" if self._woken() else "timeout"
        except Exception as error:
            log.warning("LISTEN connection failed (%s); polling until it reconnects", error)
            self.close()
            return "error"

    def _woken(self) -> bool:
        if self.wake is None or not self.wake.is_set():
            return False
        self.wake.clear()
        return True

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                self._conn.close()
            self._conn = None
