"""The project's routes plus a few that fail on purpose (tests/api/test_error_pages.py)."""

from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.http import require_GET

from config.urls import urlpatterns as project_urlpatterns


def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("secret-ish detail of a failing view")


@require_GET
def get_only(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("api/v1/test-boom/", boom),
    path("api/v1/test-get-only/", get_only),
    path("test-boom/", boom),
    *project_urlpatterns,
]
