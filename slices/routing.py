"""Websocket routes of the slices app (included by console/routing.py)."""

from __future__ import annotations

from typing import Any

from django.urls import path

from slices import consumers

websocket_urlpatterns: list[Any] = [
    path("ws/instances/<uuid:public_id>/", consumers.InstanceConsumer.as_asgi()),
    path("ws/telemetry/instances/<uuid:public_id>/", consumers.TelemetryConsumer.as_asgi()),
    path("ws/telemetry/clusters/<slug:code>/", consumers.TelemetryConsumer.as_asgi()),
]
