"""The console's own API resources (accounts glue lands here: SSH keys, tokens)."""

from __future__ import annotations

from rest_framework.routers import DefaultRouter

router = DefaultRouter()
urlpatterns: list = []
