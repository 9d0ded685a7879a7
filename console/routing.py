"""Websocket routing for every app, and the origin check in front of it."""

from __future__ import annotations

from typing import Any

from channels.routing import URLRouter
from channels.security.websocket import OriginValidator as _OriginValidator
from django.conf import settings
from django.urls import path, re_path

from console import consumers
from slices.routing import websocket_urlpatterns as slices_websockets

websocket_urlpatterns: list[Any] = [
    path("ws/notifications/", consumers.NotificationsConsumer.as_asgi()),
    *slices_websockets,
]


def OriginValidator(app: Any) -> _OriginValidator:  # noqa: N802 - mirrors the Channels wrapper name
    """Refuse websockets whose Origin is not one of our hosts (cross-site websocket hijacking)."""
    allowed = [h for h in settings.ALLOWED_HOSTS if h != "*"] + list(
        settings.WEBSOCKET_ALLOWED_ORIGINS
    )
    return _OriginValidator(app, allowed)


def websocket_router() -> URLRouter:
    """Every app's routes, then a catch-all: an unknown path closes with 4404, not a 500."""
    return URLRouter(
        [*websocket_urlpatterns, re_path(r"", consumers.UnknownPathConsumer.as_asgi())]
    )
