"""Finance exports over the API: a small one at once (`GET /costs/export/`), a large one as a
Celery task (`/cost-exports/`), downloaded by its owner until it expires."""

from __future__ import annotations

import io
from typing import Any

from django.http import FileResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.api import export_serializers as s
from billing.exports import runs as export_runs
from billing.exports.formats import CONTENT_TYPES, export_write, filename
from tenants import access

FILE_RESPONSES = {
    (200, "text/csv"): OpenApiResponse(OpenApiTypes.BINARY, description="csv and focus"),
    (200, CONTENT_TYPES["xlsx"]): OpenApiResponse(OpenApiTypes.BINARY, description="xlsx"),
}
ID = OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH)
# A file at once is written in memory within a request: larger ones are refused (a 400 that
# points to the Celery path), so a request's memory stays bounded.
SYNC_MAX_BYTES = 32 * 1024 * 1024


class ExportTooLarge(Exception):
    pass


class CappedBuffer(io.BytesIO):
    """A BytesIO that refuses to grow past `cap` bytes."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def write(self, data: Any) -> int:
        if self.tell() + len(data) > self.cap:
            raise ExportTooLarge
        return super().write(data)


class JSONErrors(DefaultContentNegotiation):
    """Files are answered as files; anything else (errors) as JSON, whatever `format` and
    Accept say: `format` is the export's, not DRF's renderer override."""

    def select_renderer(self, request: Any, renderers: Any, format_suffix: Any = None) -> Any:
        return JSONRenderer(), JSONRenderer.media_type


def _file_response(out: Any, fmt: str, name: str) -> FileResponse:
    out.seek(0)
    return FileResponse(out, as_attachment=True, filename=name, content_type=CONTENT_TYPES[fmt])


def _check_filters(user: Any, data: dict[str, Any]) -> None:
    """A tenant or project outside what the user sees is a 404, as every object is."""
    if data.get("tenant") is not None:
        access.access_tenant(user, data["tenant"])
    if data.get("project") is not None:
        access.access_project(user, data["project"])


class CostExportFileView(APIView):
    """The cost API's figures for a query, as a file, at once: for files up to
    SYNC_MAX_BYTES, written within the request. Larger ones: `POST /api/v1/cost-exports/`."""

    content_negotiation_class = JSONErrors

    @extend_schema(parameters=[s.ExportQueryIn], responses=FILE_RESPONSES)
    def get(self, request: Request) -> FileResponse:
        query = s.ExportQueryIn(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        data = dict(query.validated_data)
        fmt = data.pop("format")
        _check_filters(request.user, data)
        out = CappedBuffer(SYNC_MAX_BYTES)
        try:
            export_write(user=request.user, fmt=fmt, query=data, out=out)
        except ExportTooLarge:
            raise ValidationError(
                {
                    "non_field_errors": [
                        f"the file would be larger than {SYNC_MAX_BYTES // 2**20} MiB: start it "
                        "with POST /api/v1/cost-exports/, or narrow the window or filters."
                    ]
                }
            ) from None
        return _file_response(out, fmt, filename(fmt, data))


class CostExportViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Any]
):
    """The user's own exports (nobody else's, whatever their role): start one, follow its
    progress, download the file until it expires."""

    serializer_class = s.CostExportOut
    filter_backends: list[Any] = []

    def get_queryset(self) -> Any:
        return export_runs.cost_export_list_visible(self.request.user)

    def get_object(self) -> Any:
        return export_runs.access_cost_export(self.request.user, self.kwargs["pk"])

    @extend_schema(request=s.CostExportIn, responses={201: s.CostExportOut})
    def create(self, request: Request) -> Response:
        """Start an export of the cost API's query; a Celery task writes it."""
        body = s.CostExportIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        fmt = data.pop("format")
        _check_filters(request.user, data)
        export = export_runs.cost_export_start(
            user=request.user, fmt=fmt, query=data, now=timezone.now()
        )
        return Response(s.CostExportOut(export).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[ID], responses=s.CostExportOut)
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(s.CostExportOut(self.get_object()).data)

    @extend_schema(parameters=[ID], responses=FILE_RESPONSES)
    @action(detail=True, methods=["get"], filter_backends=[], content_negotiation_class=JSONErrors)
    def download(self, request: Request, pk: str) -> FileResponse:
        export, path = export_runs.cost_export_file(request.user, pk, now=timezone.now())
        return _file_response(path.open("rb"), export.format, export.filename)
