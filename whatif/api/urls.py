from rest_framework.routers import SimpleRouter

from whatif.api import views

router = SimpleRouter()
router.register("what-ifs", views.WhatIfViewSet, basename="whatif")

urlpatterns = router.urls
