from __future__ import annotations

from django.urls import path
from rest_framework.routers import DefaultRouter

from marketplace.api.views import (
    DatasetViewSet,
    ImageViewSet,
    LicenseViewSet,
    ModelViewSet,
    MountPlanView,
)

router = DefaultRouter()
router.register("models", ModelViewSet, basename="marketplace-model")
router.register("datasets", DatasetViewSet, basename="marketplace-dataset")
router.register("images", ImageViewSet, basename="marketplace-image")
router.register("licenses", LicenseViewSet, basename="marketplace-license")
urlpatterns: list = [path("mount-plan/", MountPlanView.as_view(), name="marketplace-mount-plan")]
