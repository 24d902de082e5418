"""The queue estimates' refresh in a process of its own (`EtaRefresher.start_background`).

Spawned, not forked: the daemon's process holds threads, locks and a database connection
that a fork would copy. The worker sets Django up itself, on the daemon's database settings
(the test database in tests) and with the daemon's session timeouts, and keeps an
`EtaRefresher` of its own for the runtime history between refreshes. Nothing here imports
Django or the models when the module is imported: the worker imports it before setting
Django up.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

# How often the worker looks whether the daemon that started it still lives.
PARENT_POLL_S = 1.0

_worker: dict[str, Any] = {}


def start(
    daemon: int,
    settings_module: str,
    database: dict[str, Any],
    config: tuple[Any, ...],
    history_every_s: float,
) -> None:
    """The worker's set-up (the pool's initializer); `daemon` is the pid of the process
    that started it."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings_module)
    import django

    django.setup()
    from django.db import connections

    connections["default"].settings_dict.update(database)
    from scheduler.estimates.refresh import EtaRefresher, EtaSettings
    from scheduler.leader import daemon_sessions_for_life

    daemon_sessions_for_life()
    _worker["refresher"] = EtaRefresher(EtaSettings(*config), history_every_s=history_every_s)
    threading.Thread(target=_exit_with, args=(daemon,), daemon=True).start()


def _exit_with(daemon: int) -> None:
    """End the worker once the daemon that started it is gone (killed, it cannot say so:
    the worker would wait for work for ever), also when it was gone before the worker was
    set up (its pid, not the parent's at that time, is the one compared). A refresh under
    way is abandoned: its transaction, not committed, goes with the connection."""
    while os.getppid() == daemon:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


def ready() -> int:
    """The worker's pid, once it is set up (`EtaRefresher.wait_ready`)."""
    return os.getpid()


def refresh(asked: Any) -> tuple[Any, str]:
    """One refresh in the worker: what it did (None for a bug, which it logs), and why it
    was not made ("" when it was): a database error or a lost lease."""
    from django.db import DatabaseError, connections

    from scheduler.leader import LeaseLost

    try:
        return _worker["refresher"]._refresh(asked), ""
    except (DatabaseError, LeaseLost) as error:
        return None, str(error)
    finally:  # a connection per refresh: a database restart between two costs nothing
        connections.close_all()
