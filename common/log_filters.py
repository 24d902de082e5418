"""Filters and the console handler of config/settings.py's LOGGING."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from django.core.exceptions import PermissionDenied
from rest_framework.exceptions import NotAuthenticated
from rest_framework.exceptions import PermissionDenied as ApiPermissionDenied

# What a person may meet in ordinary use: a page or an action their role does not allow.
REFUSALS = (PermissionDenied, ApiPermissionDenied, NotAuthenticated)


class RefusalWithoutTraceback(logging.Filter):
    """Django logs a view's PermissionDenied on `django.request` at warning with its
    traceback, as if it were a fault: a member who opens the Costs page filled the log with
    stacks. The line stays ("Forbidden (Permission denied): /costs/", with its status and
    path); the traceback goes. Any other exception, a 5xx above all, keeps it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], REFUSALS):
            record.exc_info = None
            record.exc_text = None
        return True


class CurrentStderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The console: each record written to `sys.stderr` as it is when the record is
    emitted, not as it was when logging was configured. `logging.StreamHandler` keeps the
    stream it was made with; each `django.setup()` configures logging again, so one run
    in-process while `sys.stderr` was a temporary stream (a test's captured output, a
    benchmark run inside a test) left the root handler writing to a closed file, and every
    later record printed a "--- Logging error ---" traceback instead (as the standard
    library's own last-resort handler does, the stream is looked up at each write)."""

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        """Ignored: the stream is always the current `sys.stderr`."""
