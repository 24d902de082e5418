from rest_framework.routers import SimpleRouter

from tenants.api import views

router = SimpleRouter()
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register("projects", views.ProjectViewSet, basename="project")
router.register("memberships", views.MembershipViewSet, basename="membership")
router.register("flavors", views.FlavorViewSet, basename="flavor")
router.register("quotas", views.QuotaViewSet, basename="quota")
router.register("priority-classes", views.PriorityClassViewSet, basename="priorityclass")
router.register("priority-defaults", views.PriorityDefaultViewSet, basename="prioritydefault")

urlpatterns = router.urls
