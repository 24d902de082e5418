"""`login_required` that also works for HTMX partials.

A partial polled after the session ended must not swap the login page into a table: for an
HTMX request the answer is an HX-Redirect that sends the whole window to the login page.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponseBase
from django_htmx.http import HttpResponseClientRedirect

View = Callable[..., HttpResponseBase]


def login_required(view: View) -> View:
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.user.is_authenticated:
            return view(request, *args, **kwargs)
        if request.headers.get("HX-Request") == "true":
            return HttpResponseClientRedirect(settings.LOGIN_URL)
        return redirect_to_login(request.get_full_path())

    return wrapper
