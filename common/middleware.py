"""Request guards that run before any view reads the body."""

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


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
