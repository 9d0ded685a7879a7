from __future__ import annotations

from django.urls import path

from marketplace import views

app_name = "marketplace"
urlpatterns = [
    path("marketplace/", views.model_list, name="model-list"),
    path("images/", views.image_list, name="image-list"),
]
