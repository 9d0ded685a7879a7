from __future__ import annotations

from django.urls import path
from rest_framework.routers import DefaultRouter

from slices.api import views

router = DefaultRouter()
router.register("instances", views.InstanceViewSet, basename="instance")
router.register("disks", views.DiskViewSet, basename="disk")
router.register("apps", views.AppViewSet, basename="app")
urlpatterns: list = [
    path("availability/", views.AvailabilityView.as_view(), name="availability"),
    path("storage/", views.StorageView.as_view(), name="storage"),
]
