from __future__ import annotations

from django.urls import path

from marketplace import views

app_name = "marketplace"
urlpatterns = [
    path("marketplace/", views.model_list, name="model-list"),
    path("marketplace/datasets/", views.dataset_list, name="dataset-list"),
    path("marketplace/models/<str:slug>/", views.model_detail, name="model-detail"),
    path("marketplace/datasets/<str:slug>/", views.dataset_detail, name="dataset-detail"),
    path("marketplace/licenses/<uuid:public_id>/", views.license_detail, name="license-detail"),
    path(
        "marketplace/licenses/<uuid:public_id>/accept/",
        views.license_accept,
        name="license-accept",
    ),
    path("marketplace/picker/", views.asset_picker, name="asset-picker"),
    path("images/", views.image_list, name="image-list"),
    path("images/<slug:slug>/", views.image_detail, name="image-detail"),
]
