"""Websocket routes of the slices app (included by console/routing.py)."""

from __future__ import annotations

from typing import Any

from django.urls import path

from slices import consumers, port_views

websocket_urlpatterns: list[Any] = [
    path("ws/instances/<uuid:public_id>/", consumers.InstanceConsumer.as_asgi()),
    path("ws/instances/<uuid:public_id>/terminal/", consumers.TerminalConsumer.as_asgi()),
    path("ws/telemetry/instances/<uuid:public_id>/", consumers.TelemetryConsumer.as_asgi()),
    path("ws/telemetry/clusters/<slug:code>/", consumers.TelemetryConsumer.as_asgi()),
    # An instance's web port (Jupyter's kernels): path mode, and app hosts rewritten to it.
    path(
        "instances/<uuid:public_id>/ports/<int:port>/<path:rest>",
        port_views.PortProxyConsumer.as_asgi(),
    ),
]
