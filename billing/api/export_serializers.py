"""Serializers of the finance exports: the cost API's query with a format, and an export."""

from __future__ import annotations

from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing.api.cost_serializers import CostQueryIn
from billing.models import CostExport, ExportFormat
from common.api.serializers import StrictInputSerializer

FORMAT_HELP = (
    "csv: one row per value of `by` and a totals row; xlsx: the same as a typed spreadsheet; "
    "focus: one row per cost line with the FinOps FOCUS columns."
)


class ExportQueryIn(CostQueryIn):
    """The cost API's query (window, `by`, filters) and the file's format."""

    format = serializers.ChoiceField(ExportFormat.choices, default="csv", help_text=FORMAT_HELP)


class CostExportIn(StrictInputSerializer, ExportQueryIn):
    """The body of a new export: the cost API's query as JSON, and the format."""


class ProgressOut(serializers.Serializer):
    done = serializers.IntegerField(help_text="Rows written.")
    total = serializers.IntegerField(help_text="Rows to write (0 until the rows are known).")


class CostExportOut(serializers.ModelSerializer):
    progress = serializers.SerializerMethodField()
    download = serializers.SerializerMethodField()

    class Meta:
        model = CostExport
        fields = [
            "id",
            "format",
            "state",
            "query",
            "progress",
            "filename",
            "rows",
            "size",
            "error",
            "created_at",
            "finished_at",
            "expires_at",
            "download",
        ]

    @extend_schema_field(ProgressOut)
    def get_progress(self, export: CostExport) -> dict[str, int]:
        return {"done": export.progress_done, "total": export.progress_total}

    @extend_schema_field({"type": "string", "nullable": True})
    def get_download(self, export: CostExport) -> str | None:
        """The file's path on this server once it is written."""
        if export.state != "done":
            return None
        return reverse("costexport-download", kwargs={"pk": export.pk})
