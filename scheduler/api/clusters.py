"""Cluster API (docs/multicluster.md): each cluster with its state, inventory and use, for
those who read the node inventory (platform admins, finance, tenant admins; anyone else an
empty list and 404); platform admins add, change, cordon, uncordon and remove clusters.

Credentials are references (a kubeconfig path or a mounted Secret's file, and a context);
nothing here takes or shows a credential itself.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from common.api.serializers import StrictInputSerializer, refuse_any_body
from scheduler.clusters import services
from scheduler.clusters.selectors import ClusterUse, cluster_list_visible, cluster_use
from scheduler.models import Cluster, ClusterBackendKind
from tenants import access


def labels_field(**kwargs: Any) -> serializers.DictField:
    """A cluster's labels: `region` and `site` (where it is), and any other Kubernetes-style
    label an admin marks it with, such as the data it holds; checked by the service."""
    return serializers.DictField(
        child=serializers.CharField(max_length=63, allow_blank=True),
        help_text=(
            "Labels: region and site (DNS labels), and any other Kubernetes-style label, "
            'e.g. {"region": "eu", "data.example.com/imagenet": "true"}; jobs ask for clusters '
            "by them (placement.cluster_labels, preferred_cluster_labels)."
        ),
        **kwargs,
    )


class ClusterOut(serializers.ModelSerializer):
    labels = labels_field(read_only=True)
    nodes = serializers.SerializerMethodField(help_text="Nodes the cluster lists.")
    nodes_ready = serializers.SerializerMethodField()
    gpus = serializers.SerializerMethodField()
    gpus_allocated = serializers.SerializerMethodField(help_text="In GPUs (2.5: two and a half).")
    utilization = serializers.SerializerMethodField(
        help_text="GPUs allocated over GPUs (0..1); null without GPUs."
    )

    class Meta:
        model = Cluster
        fields = [
            "id",
            "name",
            "backend",
            "home",
            "state",
            "labels",
            "kubeconfig_path",
            "kubeconfig_secret",
            "kube_context",
            "last_seen_at",
            "lost_after_s",
            "nodes",
            "nodes_ready",
            "gpus",
            "gpus_allocated",
            "utilization",
            "created_at",
        ]

    def _use(self, cluster: Cluster) -> ClusterUse:
        """Read once per answer (a list's page or one cluster), kept in the context."""
        use: dict[int, ClusterUse] = self.context.setdefault("use", {})  # type: ignore[attr-defined]
        if not use:
            use.update(cluster_use())
            use.setdefault(0, ClusterUse())  # read: an empty inventory is not read again
        return use.get(cluster.pk, ClusterUse())

    def get_nodes(self, cluster: Cluster) -> int:
        return self._use(cluster).nodes

    def get_nodes_ready(self, cluster: Cluster) -> int:
        return self._use(cluster).nodes_ready

    def get_gpus(self, cluster: Cluster) -> int:
        return self._use(cluster).gpus

    def get_gpus_allocated(self, cluster: Cluster) -> float:
        return self._use(cluster).gpus_allocated_milli / 1000

    def get_utilization(self, cluster: Cluster) -> float | None:
        return self._use(cluster).utilization


class ClusterCreateIn(StrictInputSerializer):
    name = serializers.CharField(max_length=63)
    backend = serializers.ChoiceField(choices=ClusterBackendKind.choices)
    kubeconfig_path = serializers.CharField(max_length=500, required=False, allow_blank=True)
    kubeconfig_secret = serializers.CharField(max_length=253, required=False, allow_blank=True)
    kube_context = serializers.CharField(max_length=253, required=False, allow_blank=True)
    labels = labels_field(required=False)
    lost_after_s = serializers.IntegerField(required=False, allow_null=True)


class ClusterUpdateIn(StrictInputSerializer):
    kubeconfig_path = serializers.CharField(max_length=500, required=False, allow_blank=True)
    kubeconfig_secret = serializers.CharField(max_length=253, required=False, allow_blank=True)
    kube_context = serializers.CharField(max_length=253, required=False, allow_blank=True)
    labels = labels_field(required=False)
    lost_after_s = serializers.IntegerField(required=False, allow_null=True)


class ClusterViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    serializer_class = ClusterOut
    filterset_fields = ["state", "backend"]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self) -> Any:
        return cluster_list_visible(self.request.user)

    def _answer(self, cluster: Cluster, code: int = status.HTTP_200_OK) -> Response:
        return Response(ClusterOut(Cluster.objects.get(pk=cluster.pk)).data, status=code)

    @extend_schema(request=ClusterCreateIn, responses={201: ClusterOut})
    def create(self, request: Request) -> Response:
        access.require_platform_admin(request.user)
        body = ClusterCreateIn(data=request.data)
        body.is_valid(raise_exception=True)
        made = services.cluster_create(user=request.user, **body.validated_data)
        return self._answer(made, status.HTTP_201_CREATED)

    @extend_schema(request=ClusterUpdateIn, responses=ClusterOut)
    def partial_update(self, request: Request, pk: str) -> Response:
        cluster = self.get_object()
        access.require_platform_admin(request.user)
        body = ClusterUpdateIn(data=request.data)
        body.is_valid(raise_exception=True)
        services.cluster_update(user=request.user, cluster=cluster, **body.validated_data)
        return self._answer(cluster)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Only a cluster that never had nodes (409 otherwise: cordon it instead)."""
        cluster = self.get_object()
        access.require_platform_admin(request.user)
        services.cluster_delete(user=request.user, cluster=cluster)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=ClusterOut)
    @action(detail=True, methods=["post"])
    def cordon(self, request: Request, pk: str) -> Response:
        """Nothing new is placed in the cluster; what runs there keeps running."""
        return self._cordon(request, cordoned=True)

    @extend_schema(request=None, responses=ClusterOut)
    @action(detail=True, methods=["post"])
    def uncordon(self, request: Request, pk: str) -> Response:
        return self._cordon(request, cordoned=False)

    def _cordon(self, request: Request, *, cordoned: bool) -> Response:
        cluster = self.get_object()
        access.require_platform_admin(request.user)
        refuse_any_body(request.data)
        services.cluster_set_cordoned(user=request.user, cluster=cluster, cordoned=cordoned)
        return self._answer(cluster)
