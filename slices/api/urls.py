from __future__ import annotations

from django.urls import path
from rest_framework.routers import DefaultRouter

from slices.api import reservation_views, slurm_views, views

router = DefaultRouter()
router.register("instances", views.InstanceViewSet, basename="instance")
router.register("disks", views.DiskViewSet, basename="disk")
router.register("apps", views.AppViewSet, basename="app")
router.register("reservations", reservation_views.ReservationViewSet, basename="reservation")
urlpatterns: list = [
    path("availability/", views.AvailabilityView.as_view(), name="availability"),
    path("storage/", views.StorageView.as_view(), name="storage"),
    path("capacity/", reservation_views.CapacityView.as_view(), name="capacity"),
    # A slice's Slurm jobs (issue 31).
    path("instances/<str:public_id>/jobs/", slurm_views.JobListView.as_view(), name="job-list"),
    path(
        "instances/<str:public_id>/jobs/<str:job_id>/",
        slurm_views.JobDetailView.as_view(),
        name="job-detail",
    ),
    path(
        "instances/<str:public_id>/jobs/<str:job_id>/cancel/",
        slurm_views.JobCancelView.as_view(),
        name="job-cancel",
    ),
]
