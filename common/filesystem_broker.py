"""The embedded default's Celery broker: kombu's filesystem transport, with every message file
complete before a worker can see it.

kombu's `Channel._put` creates the message file under its final name in the queue folder, then
writes it, under an advisory lock that its reader never takes. A worker that lists the folder
between the two moves the empty (or half-written) file away, cannot decode it, and stops with
"Unrecoverable error: JSONDecodeError" (celery/kombu#1551); `make run`'s supervisor then stops
the web server and the scheduler with it. Here a message is written under a name the reader
skips (it does not end in `.<queue>.msg`) and renamed into place, which POSIX makes atomic
within a folder. A file that still cannot be decoded (written by something else) is logged and
dropped rather than taken for a broken broker: every task is idempotent and swept by beat.

`CELERY_BROKER_TRANSPORT` names this transport in config/settings.py when there is no Redis.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from queue import Empty
from time import time_ns
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

log = logging.getLogger("gantry.broker")


class Channel(filesystem.Channel):
    # kombu's filesystem Channel names the message `payload`, its base `message`: no
    # signature satisfies both.
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Put `payload` onto `queue`: written aside, then renamed into the queue folder.
        The reader takes files in the order of their names, so a name starts with the wall
        clock in nanoseconds at a fixed width: kombu's own, milliseconds of the monotonic
        clock, sorted newer messages first once that count gained a digit (at 10,000 s of
        uptime, and again at 100,000), and restarted from zero at every boot while the
        queue folder keeps its messages."""
        name = f"{time_ns():020d}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        try:
            with open(partial, "wb") as out:
                out.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        """The next message of `queue`; a file that is not a message is dropped, not fatal."""
        try:
            return super()._get(queue)
        except ValueError as exc:  # json's JSONDecodeError; the file is already moved away
            log.error("dropped a message file of queue %s that is not JSON: %s", queue, exc)
            raise Empty from None


class Transport(filesystem.Transport):
    Channel = Channel
