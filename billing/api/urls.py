from django.urls import path
from rest_framework.routers import SimpleRouter

from billing.api import costs, quotes, views

router = SimpleRouter()
router.register("rate-cards", views.RateCardViewSet, basename="ratecard")
router.register("statements", costs.StatementViewSet, basename="statement")
router.register("billing-policies", costs.BillingPolicyViewSet, basename="billingpolicy")

urlpatterns = [
    path("costs/", costs.CostListView.as_view(), name="cost-list"),
    path("quotes/", quotes.QuoteView.as_view(), name="quote"),
    *router.urls,
]
