"""`GET /api/v1/clusters/utilization/`: GPUs allocated and used per cluster over a dashboard
range (issue 38), from the device roll-ups (`scheduler.telemetry.cluster_history`).

Read as the clusters API is (`cluster_list_visible`: platform admins, finance, tenant admins;
anyone else an empty list, and no cluster name is known to them). `range`: 6h, 24h (default),
7d or 30d; `cluster`: a cluster's name, that cluster only. A bad value is a 400 naming the
parameter.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api.serializers import StrictInputSerializer
from scheduler.clusters.selectors import cluster_list_visible
from scheduler.models import Cluster
from scheduler.telemetry.cluster_history import utilization_by_cluster
from scheduler.telemetry.dashboards import DEFAULT_RANGE, RANGES, window_for


class ClusterUtilizationQuery(StrictInputSerializer):
    range = serializers.ChoiceField(list(RANGES), default=DEFAULT_RANGE, required=False)
    cluster = serializers.CharField(
        required=False,
        default=None,
        max_length=63,
        help_text="A cluster's name: its history only. Left out: every cluster.",
    )


class PointOut(serializers.Serializer):
    start = serializers.DateTimeField()
    allocated_gpus = serializers.FloatField(source="allocated", help_text="Mean GPUs held.")
    used_gpus = serializers.FloatField(
        source="used", help_text="Mean busy GPU-equivalents (devices x their utilization)."
    )


class ClusterSeriesOut(serializers.Serializer):
    cluster = serializers.CharField()
    points = PointOut(many=True)


class ClusterUtilizationOut(serializers.Serializer):
    range = serializers.CharField()
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    period = serializers.CharField(help_text="5m or 1h: the roll-ups read.")
    clusters = ClusterSeriesOut(many=True)


class ClusterUtilizationView(APIView):
    """Utilization history per cluster (allocated and used GPUs per window)."""

    @extend_schema(parameters=[ClusterUtilizationQuery], responses=ClusterUtilizationOut)
    def get(self, request: Request) -> Response:
        visible = cluster_list_visible(request.user)
        query = ClusterUtilizationQuery(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        data: dict[str, Any] = query.validated_data
        cluster: Cluster | None = None
        if data["cluster"] is not None:
            # Only the clusters the user reads are known names.
            cluster = visible.filter(name=data["cluster"]).first()
            if cluster is None:
                raise ValidationError({"cluster": [f"no cluster named {data['cluster']}."]})
        window = window_for(data["range"], timezone.now())
        names = set(visible.values_list("name", flat=True))
        series = {
            name: points
            for name, points in utilization_by_cluster(window, cluster).items()
            if name in names
        }
        body = {
            "range": window.key,
            "since": window.since,
            "until": window.until,
            "period": window.period,
            "clusters": [{"cluster": name, "points": points} for name, points in series.items()],
        }
        return Response(ClusterUtilizationOut(body).data)
