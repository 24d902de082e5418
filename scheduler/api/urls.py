from rest_framework.routers import SimpleRouter

from scheduler.api import approvals, nodes, views

router = SimpleRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("nodes", nodes.NodeViewSet, basename="node")
router.register("approval-requests", approvals.ApprovalRequestViewSet, basename="approvalrequest")

urlpatterns = router.urls
