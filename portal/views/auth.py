"""Login with brute-force slowing; logout by POST (Django's LogoutView flushes the session)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse

from common import login_guard


class PortalLoginView(auth_views.LoginView):
    """Django's login (which rotates the session key on success) behind a failure counter."""

    template_name = "registration/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        username = str(request.POST.get("username", ""))[:150]
        address = login_guard.client_address(request)
        refusal = login_guard.refusal(username, address)
        if refusal is not None:
            # Refuse before checking the password, so a lockout cannot confirm a guess.
            login_guard.record_refusal(username, address)
            form = self.get_form_class()(request, initial={"username": username})
            context = self.get_context_data(form=form, locked_message=refusal.message("sign-ins"))
            response = self.render_to_response(context, status=429)
            response["Retry-After"] = str(refusal.wait_s)
            return response
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form: Any) -> HttpResponse:
        login_guard.record_failure(
            str(self.request.POST.get("username", ""))[:150],
            login_guard.client_address(self.request),
        )
        return super().form_invalid(form)

    def form_valid(self, form: Any) -> HttpResponse:
        login_guard.record_success(
            form.get_user().get_username(), login_guard.client_address(self.request)
        )
        return super().form_valid(form)


class PortalLogoutView(auth_views.LogoutView):
    """POST only (Django 5): flushes the session, so the old session id is dead."""
