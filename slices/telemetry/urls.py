from __future__ import annotations

from django.urls import path

from slices.telemetry import views

app_name = "telemetry"
urlpatterns = [
    path(
        "instances/<uuid:public_id>/telemetry/history.json",
        views.instance_history,
        name="instance-history",
    ),
    path("instances/<uuid:public_id>/telemetry.csv", views.instance_csv, name="instance-csv"),
    path("ops/clusters/<slug:code>/telemetry.json", views.cluster_latest, name="cluster-latest"),
    path("metrics", views.metrics, name="metrics"),
]
