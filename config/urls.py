"""URL wiring: the REST API under /api/v1/, its schema and docs, health, the portal."""

from django.urls import URLPattern, URLResolver, include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from common.api.auth import GuardedObtainAuthToken, RotateToken
from common.api.errors import not_found
from scheduler.metrics.exporter import metrics_view
from scheduler.views import healthz
from tenants.api.views import MeView

api_v1: list[URLPattern | URLResolver] = [
    path("", include("tenants.api.urls")),
    path("", include("scheduler.api.urls")),
    path("", include("billing.api.urls")),
    path("", include("whatif.api.urls")),
    path("", include("capacity.api.urls")),
    path("me/", MeView.as_view(), name="me"),
    path("auth/token/", GuardedObtainAuthToken.as_view(), name="api-token"),
    path("auth/token/rotate/", RotateToken.as_view(), name="api-token-rotate"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # Its start-up script as a file of its own (`?script`): no inline script, for the CSP.
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
]

# A path under /api/ that matches no route answers JSON, as the schema promises.
handler404 = "common.api.errors.not_found"

urlpatterns = [
    path("api/v1/", include(api_v1)),
    # The rest of /api/ as a route of its own, so that its 404 is JSON whatever DEBUG says
    # (Django's DEBUG page, which lists every route, replaces handler404 when DEBUG is on).
    # CSRF-exempt as every API view is (DRF's): a POST answers the 404, not Django's HTML 403.
    re_path(r"^api/", csrf_exempt(not_found), name="api-not-found"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    # The portal, including login (with brute-force slowing) and logout.
    path("", include("portal.urls")),
]
