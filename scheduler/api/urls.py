from rest_framework.routers import SimpleRouter

from scheduler.api import views

router = SimpleRouter()
router.register("jobs", views.JobViewSet, basename="job")

urlpatterns = router.urls
