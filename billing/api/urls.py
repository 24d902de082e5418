from rest_framework.routers import SimpleRouter

from billing.api import views

router = SimpleRouter()
router.register("rate-cards", views.RateCardViewSet, basename="ratecard")

urlpatterns = [*router.urls]
