"""Filters of config/settings.py's LOGGING."""

from __future__ import annotations

import logging

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
