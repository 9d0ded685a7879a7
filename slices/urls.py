from __future__ import annotations

from django.urls import path

from slices import views

app_name = "slices"
urlpatterns = [
    path("instances/", views.instance_list, name="instance-list"),
]
