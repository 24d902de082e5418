from django.urls import path

from billing.api import budgets, costs, exports, quotes, views
from common.api.routers import IdRouter

router = IdRouter()
router.register("rate-cards", views.RateCardViewSet, basename="ratecard")
router.register("budgets", budgets.BudgetViewSet, basename="budget")
router.register("statements", costs.StatementViewSet, basename="statement")
router.register("billing-policies", costs.BillingPolicyViewSet, basename="billingpolicy")
router.register("cost-exports", exports.CostExportViewSet, basename="costexport")

urlpatterns = [
    path("costs/", costs.CostListView.as_view(), name="cost-list"),
    path("costs/export/", exports.CostExportFileView.as_view(), name="cost-export"),
    path("quotes/", quotes.QuoteView.as_view(), name="quote"),
    *router.urls,
]
