from django.urls import re_path

from common.api.routers import ID_PATTERN, IdRouter
from scheduler.api import (
    approvals,
    cluster_history,
    clusters,
    nodes,
    pods,
    queue,
    queue_list,
    usage,
    views,
)

router = IdRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("nodes", nodes.NodeViewSet, basename="node")
router.register("clusters", clusters.ClusterViewSet, basename="cluster")
router.register("approval-requests", approvals.ApprovalRequestViewSet, basename="approvalrequest")

urlpatterns = [
    # The router's detail pattern, so that the isolation walks see a detail route.
    re_path(
        rf"^jobs/(?P<pk>{ID_PATTERN})/queue/\Z",
        queue.JobQueueView.as_view(),
        name="jobqueue-detail",
    ),
    re_path(
        rf"^jobs/(?P<pk>{ID_PATTERN})/pods/\Z", pods.JobPodsView.as_view(), name="jobpods-detail"
    ),
    re_path(
        rf"^jobs/(?P<pk>{ID_PATTERN})/logs/\Z", pods.JobLogsView.as_view(), name="joblogs-detail"
    ),
    re_path(r"^queue/\Z", queue_list.QueueListView.as_view(), name="queue-list"),
    re_path(r"^usage/\Z", usage.UsageView.as_view(), name="usage-list"),
    re_path(
        r"^clusters/utilization/\Z",
        cluster_history.ClusterUtilizationView.as_view(),
        name="cluster-utilization",
    ),
    *router.urls,
]
