from common.api.routers import IdRouter
from whatif.api import views

router = IdRouter()
router.register("what-ifs", views.WhatIfViewSet, basename="whatif")

urlpatterns = router.urls
