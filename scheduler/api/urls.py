from rest_framework.routers import SimpleRouter

from scheduler.api import approvals, views

router = SimpleRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("approval-requests", approvals.ApprovalRequestViewSet, basename="approvalrequest")

urlpatterns = router.urls
