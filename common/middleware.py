"""Request guards that run before any view reads the body, and the error pages' last word."""

import ipaddress
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.template.response import SimpleTemplateResponse
from django.views import defaults
from rest_framework.response import Response


class BodySizeLimitMiddleware:
    """Refuse a request whose declared body exceeds GANTRY_MAX_BODY_BYTES with 413.

    Checked on Content-Length so that nothing is read into memory; Django's own
    DATA_UPLOAD_MAX_MEMORY_SIZE still bounds chunked bodies that declare no length.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.GANTRY_MAX_BODY_BYTES
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return JsonResponse({"detail": "Content-Length is not a number."}, status=400)
        if length > limit:
            return JsonResponse(
                {"detail": f"Request body of {length} bytes exceeds the limit of {limit} bytes."},
                status=413,
            )
        return self.get_response(request)


LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
GENERIC_DETAIL = {
    400: "Bad request.",
    403: "Permission denied.",
    404: "Not found.",
    405: "Method not allowed.",
    500: "A server error occurred.",
}


class ErrorPagesMiddleware:
    """Error answers that Django writes itself (not a view of ours), made fit for the client.

    1. Under /api/, an error that is not the API's JSON (a resolver's 404, a method Django
       refused, an exception no handler took, a DEBUG page) becomes the API's error shape,
       `{"detail": ...}`, with its status and headers, whatever DEBUG says.
    2. With DEBUG on (`make run`), Django's technical pages (the 404 that lists every route,
       the 500 and 400 with tracebacks and settings) are shown to loopback clients only: any
       other client gets the generic page DEBUG off would serve. DRF's answers and our
       templates are left alone.

    Listed first in MIDDLEWARE, so that it sees what every inner layer answered, exceptions
    included (Django turns each into a response at the layer where it was raised).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code < 400 or not _written_by_django(response):
            return response
        if request.path.startswith("/api/"):
            return _as_api_error(response)
        if settings.DEBUG and not _loopback(request) and _technical(response):
            return _generic_page(request, response.status_code)
        return response


def _written_by_django(response: HttpResponse) -> bool:
    """Not a DRF answer (JSON or its browsable page), not a rendered template of ours."""
    if isinstance(response, Response | SimpleTemplateResponse | StreamingHttpResponse):
        return False
    return not response.get("Content-Type", "").startswith("application/json")


def _technical(response: HttpResponse) -> bool:
    # technical_404_response, technical_500_response (also used for a 400 under DEBUG) answer
    # these statuses as plain HTML; an error page a view renders itself is a TemplateResponse.
    return response.status_code in (400, 404) or response.status_code >= 500


def _loopback(request: HttpRequest) -> bool:
    try:
        address = ipaddress.ip_address(str(request.META.get("REMOTE_ADDR", "")))
    except ValueError:
        return False
    return any(address in network for network in LOOPBACK)


def _as_api_error(response: HttpResponse) -> HttpResponse:
    status = response.status_code
    detail = GENERIC_DETAIL.get(status) or (
        GENERIC_DETAIL[500] if status >= 500 else response.reason_phrase
    )
    answer = JsonResponse({"detail": detail}, status=status)
    for header in ("Allow", "Retry-After"):
        if header in response:
            answer[header] = response[header]
    return answer


def _generic_page(request: HttpRequest, status: int) -> HttpResponse:
    if status == 404:
        return defaults.page_not_found(request, Http404())
    if status == 400:
        return defaults.bad_request(request, SuspiciousOperation())
    return defaults.server_error(request)


class ContentSecurityPolicyMiddleware:
    """`Content-Security-Policy: settings.GANTRY_CSP` on every HTML answer.

    The portal loads its scripts (htmx, portal.js, plotly.js, charts.js) and styles from its own
    static files, with no inline script: data for the charts comes in `json_script` blocks,
    which are not run. Styles may be inline (`style-src 'unsafe-inline'`): the templates' style
    attributes, and the `<style>` elements htmx, plotly.js and Swagger UI write. The API's docs
    page serves its start-up script as a file of its own (SpectacularSwaggerSplitView).
    A response that sets its own policy keeps it.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        policy = settings.GANTRY_CSP
        if policy and response.get("Content-Type", "").startswith("text/html"):
            response.headers.setdefault("Content-Security-Policy", policy)
        return response
