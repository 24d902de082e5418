from django.urls import path

from capacity.api import views
from common.api.routers import IdRouter

router = IdRouter()
router.register("capacity/targets", views.PoolTargetViewSet, basename="pooltarget")
router.register("capacity/tco-inputs", views.TcoInputsViewSet, basename="tcoinputs")
router.register("capacity/rate-suggestions", views.RateSuggestionViewSet, basename="ratesuggestion")

urlpatterns = [
    path("capacity/plans/", views.PlanListView.as_view(), name="capacity-plans"),
    path("capacity/export/", views.PlanExportView.as_view(), name="capacity-export"),
    path("capacity/expansions/", views.ExpansionView.as_view(), name="capacity-expansions"),
    *router.urls,
]
