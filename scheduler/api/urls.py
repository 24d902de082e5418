from django.urls import re_path
from rest_framework.routers import SimpleRouter

from scheduler.api import approvals, nodes, queue, views

router = SimpleRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("nodes", nodes.NodeViewSet, basename="node")
router.register("approval-requests", approvals.ApprovalRequestViewSet, basename="approvalrequest")

urlpatterns = [
    # The router's detail pattern, so that the isolation walks see a detail route.
    re_path(r"^jobs/(?P<pk>[^/.]+)/queue/\Z", queue.JobQueueView.as_view(), name="jobqueue-detail"),
    *router.urls,
]
