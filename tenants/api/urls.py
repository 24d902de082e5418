from django.urls import path

from common.api.routers import IdRouter
from tenants.api import governance, views

router = IdRouter()
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register("projects", views.ProjectViewSet, basename="project")
router.register("memberships", views.MembershipViewSet, basename="membership")
router.register("flavors", views.FlavorViewSet, basename="flavor")
router.register("quotas", views.QuotaViewSet, basename="quota")
router.register("priority-classes", views.PriorityClassViewSet, basename="priorityclass")
router.register("priority-defaults", views.PriorityDefaultViewSet, basename="prioritydefault")
router.register("approval-policies", governance.ApprovalPolicyViewSet, basename="approvalpolicy")
router.register("quota-requests", governance.QuotaRequestViewSet, basename="quotarequest")
router.register("audit", governance.AuditEntryViewSet, basename="audit")

urlpatterns = [
    path("audit/export.csv", governance.AuditExportView.as_view(), name="audit-export"),
    *router.urls,
]
