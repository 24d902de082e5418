"""Node API: inventory for admins, cordon/drain/uncordon (and simulated fail/heal) for
platform admins, and the node agent's GPU report.

Who sees nodes: platform admins, finance and tenant admins (the inventory holds no tenant
data); members get an empty list and 404 on details. Actions: platform admins only.
`POST /api/v1/nodes/report/`: a node's agent, for that node only, or a platform admin for any;
readings only for the devices the cluster lists. On Kubernetes the agent sends its pod's
projected service-account token (`Bearer`), which the API server vouches for and which names
the pod's node (scheduler/nodes/agent_auth.py); elsewhere the token of `manage.py node_agent_token
NODE`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from common.api.serializers import StrictInputSerializer
from common.api.throttles import AgentThrottle
from scheduler.models import Cluster, GpuDevice, Node, XidEvent
from scheduler.nodes import services
from scheduler.nodes.agent_auth import AgentTokenAuthentication
from scheduler.nodes.holders import node_device_holders
from scheduler.nodes.selectors import node_xid_history, xids_since
from tenants import access
from tenants.models import Role


class GpuOut(serializers.ModelSerializer):
    class Meta:
        model = GpuDevice
        fields = [
            "index",
            "uuid",
            "model",
            "memory_mib",
            "healthy",
            "health_reason",
            "allocated_milli",
            "memory_used_mib",
            "utilization_pct",
            "temperature_c",
            "ecc_uncorrected",
            "xid_errors",
            "reported_at",
        ]


class NodeOut(serializers.ModelSerializer):
    gpus = GpuOut(source="devices", many=True, read_only=True)
    cluster: serializers.SlugRelatedField[Cluster] = serializers.SlugRelatedField(
        slug_field="name",
        read_only=True,
        allow_null=True,
        help_text="The node's cluster (docs/multicluster.md); null: the home cluster.",
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "cluster",
            "flavor",
            "pool",
            "cpu_milli",
            "memory_mib",
            "labels",
            "ready",
            "present",
            "cordoned",
            "cordoned_by",
            "cordon_reason",
            "drain_requested",
            "sim_failed",
            "driver_version",
            "last_report_at",
            "gpus",
        ]


class NodeListOut(NodeOut):
    xids_24h = serializers.IntegerField(
        source="xids_recent", read_only=True, help_text="XIDs reported in the last 24 hours."
    )

    class Meta(NodeOut.Meta):
        fields = [*NodeOut.Meta.fields, "xids_24h"]


class XidOut(serializers.ModelSerializer):
    gpu = serializers.IntegerField(source="device.index", read_only=True)
    meaning = serializers.CharField(read_only=True, help_text='"" for codes not in the list.')

    class Meta:
        model = XidEvent
        fields = ["seen_at", "gpu", "uuid", "code", "meaning", "fatal", "count"]


class NodeDetailOut(NodeOut):
    xid_history = XidOut(
        many=True,
        read_only=True,
        help_text="The node agent's latest XIDs, newest first.",
    )

    class Meta(NodeOut.Meta):
        fields = [*NodeOut.Meta.fields, "xid_history"]


class NodeActionIn(StrictInputSerializer):
    reason = serializers.CharField(required=False, default="", max_length=300, allow_blank=True)


class GpuReading(StrictInputSerializer):
    index = serializers.IntegerField(min_value=0, max_value=255)
    uuid = serializers.CharField(max_length=64, allow_blank=True)
    name = serializers.CharField(max_length=63, allow_blank=True)
    memory_total_mib = serializers.IntegerField(min_value=0, max_value=1 << 24)
    memory_used_mib = serializers.IntegerField(min_value=0, max_value=1 << 24)
    utilization_pct = serializers.FloatField(min_value=0, max_value=100)
    temperature_c = serializers.FloatField(min_value=-50, max_value=200)
    # Optional: older agents do not send them, and not every GPU offers them (SM activity
    # comes from NVML's GPM, Hopper and newer).
    power_w = serializers.FloatField(min_value=0, max_value=5000, required=False, allow_null=True)
    sm_active_pct = serializers.FloatField(
        min_value=0, max_value=100, required=False, allow_null=True
    )
    ecc_uncorrected = serializers.IntegerField(min_value=0, max_value=1 << 31)
    xid_errors = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=1 << 16), max_length=64
    )
    healthy = serializers.BooleanField()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["memory_used_mib"] > attrs["memory_total_mib"]:
            raise serializers.ValidationError(
                {"memory_used_mib": ["More than the device's memory_total_mib."]}
            )
        return attrs


class HolderOut(serializers.Serializer):
    index = serializers.IntegerField()
    pod = serializers.CharField()
    namespace = serializers.CharField()
    milli = serializers.IntegerField()


class GpuReportOut(NodeOut):
    """The node, and who holds its devices now (the agent labels its exported series with
    them: scheduler/agent/exporter.py)."""

    holders = HolderOut(many=True, read_only=True)

    class Meta(NodeOut.Meta):
        fields = [*NodeOut.Meta.fields, "holders"]


class GpuReportIn(StrictInputSerializer):
    node = serializers.CharField(max_length=253)
    driver_version = serializers.CharField(max_length=64, allow_blank=True)
    gpus = serializers.ListField(child=GpuReading(), max_length=64)

    def validate_gpus(self, gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # Two readings of one device would be two samples of it at one instant.
        indexes = [gpu["index"] for gpu in gpus]
        twice = sorted({index for index in indexes if indexes.count(index) > 1})
        if twice:
            listed = ", ".join(map(str, twice[:8]))
            raise serializers.ValidationError(f"GPU index {listed} is reported twice.")
        return gpus


def node_list_visible(user: Any) -> Any:
    grants = access.grants_for(user)
    admin = grants.sees_everything or Role.ADMIN in grants.roles_by_path.values()
    if not admin:
        return Node.objects.none()
    return Node.objects.select_related("cluster").prefetch_related("devices").order_by("name")


class NodeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = NodeOut
    filterset_fields = ["cluster", "flavor", "pool", "ready", "cordoned"]

    def get_queryset(self) -> Any:
        nodes = node_list_visible(self.request.user)
        if self.action == "list":
            nodes = nodes.annotate(xids_recent=xids_since(timezone.now() - timedelta(hours=24)))
        return nodes

    def get_serializer_class(self) -> Any:
        return {"list": NodeListOut, "retrieve": NodeDetailOut}.get(self.action, NodeOut)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        node = self.get_object()
        node.xid_history = node_xid_history(node)  # type: ignore[attr-defined]
        return Response(NodeDetailOut(node).data)

    def _act(self, request: Request, change: Any) -> Response:
        node = self.get_object()
        # Who may act comes first: finance gets 403 whatever the body holds.
        access.require_platform_admin(request.user)
        body = NodeActionIn(data=request.data)
        body.is_valid(raise_exception=True)
        node = change(node, body.validated_data["reason"])
        return Response(NodeOut(Node.objects.prefetch_related("devices").get(pk=node.pk)).data)

    @extend_schema(request=NodeActionIn, responses=NodeOut)
    @action(detail=True, methods=["post"])
    def cordon(self, request: Request, pk: str) -> Response:
        return self._act(
            request, lambda n, r: services.node_cordon(user=request.user, node=n, reason=r)
        )

    @extend_schema(request=NodeActionIn, responses=NodeOut)
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str) -> Response:
        return self._act(
            request, lambda n, r: services.node_drain(user=request.user, node=n, reason=r)
        )

    @extend_schema(request=NodeActionIn, responses=NodeOut)
    @action(detail=True, methods=["post"])
    def uncordon(self, request: Request, pk: str) -> Response:
        return self._act(request, lambda n, r: services.node_uncordon(user=request.user, node=n))

    @extend_schema(request=NodeActionIn, responses=NodeOut)
    @action(detail=True, methods=["post"])
    def fail(self, request: Request, pk: str) -> Response:
        """Simulated cluster: fail the node (its pods are lost, it reports NotReady)."""
        return self._act(
            request, lambda n, r: services.node_set_failed(user=request.user, node=n, failed=True)
        )

    @extend_schema(request=NodeActionIn, responses=NodeOut)
    @action(detail=True, methods=["post"])
    def heal(self, request: Request, pk: str) -> Response:
        """Simulated cluster: heal the node; also declares its GPUs healthy again."""
        return self._act(request, lambda n, r: services.node_heal(user=request.user, node=n))

    @extend_schema(request=GpuReportIn, responses=GpuReportOut)
    @action(
        detail=False,
        methods=["post"],
        permission_classes=[IsAuthenticated],
        # The agent's service-account token on Kubernetes; this route only, so that the token
        # of a GPU node's pod opens nothing else.
        authentication_classes=[
            *api_settings.DEFAULT_AUTHENTICATION_CLASSES,
            AgentTokenAuthentication,
        ],
        # Counted per agent (per node) alone, so that a cluster's agents never share a limit.
        throttle_classes=[AgentThrottle],
    )
    def report(self, request: Request) -> Response:
        """The node agent's readings of every GPU of one node."""
        if not services.can_report(request.user):
            raise PermissionDenied("Only node agents and platform admins post GPU reports.")
        body = GpuReportIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        services.require_reporter(request.user, data["node"])
        node = Node.objects.filter(name=data["node"]).first()
        if node is None:
            raise NotFound(f"unknown node {data['node'][:64]!r}; the scheduler lists it first.")
        node = services.gpu_report(
            user=request.user, node=node, driver_version=data["driver_version"], gpus=data["gpus"]
        )
        node = Node.objects.prefetch_related("devices").get(pk=node.pk)
        node.holders = node_device_holders(node)  # type: ignore[attr-defined]
        return Response(GpuReportOut(node).data)
