"""Websocket routing for every app, and the origin check in front of it."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.routing import URLRouter
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http.request import split_domain_port, validate_host
from django.urls import path, re_path

from console import consumers
from slices.routing import websocket_urlpatterns as slices_websockets

websocket_urlpatterns: list[Any] = [
    path("ws/notifications/", consumers.NotificationsConsumer.as_asgi()),
    *slices_websockets,
]


_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalise_origin(text: str) -> str | None:
    """``scheme://host[:port]`` lowercased with the scheme's default port dropped, or None when
    ``text`` is not an http(s) origin (no path, query, user or fragment; "null" is not one)."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username is not None:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    host = parts.hostname.lower()
    if ":" in host:  # IPv6 literal: urlsplit dropped the brackets
        host = f"[{host}]"
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def _headers(scope: dict[str, Any]) -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = {}
    for name, value in scope.get("headers", []):
        out.setdefault(bytes(name).lower(), []).append(bytes(value))
    return out


def _one(headers: dict[bytes, list[bytes]], name: bytes) -> str | None:
    values = headers.get(name, [])
    if len(values) != 1:
        return None  # absent, or sent twice (which one would the browser have meant?)
    try:
        return values[0].decode("ascii")
    except UnicodeDecodeError:
        return None


def own_origin(scope: dict[str, Any]) -> str | None:
    """The origin this handshake was made to, as Django would build it for an HTTP request:
    the scheme from ``SECURE_PROXY_SSL_HEADER`` when it is set and sent (else the connection's:
    wss → https), the host and port from the Host header (``X-Forwarded-Host`` with
    ``USE_X_FORWARDED_HOST``), which must be one of ``ALLOWED_HOSTS``. None when not valid."""
    headers = _headers(scope)
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header:
        name, secure_value = proxy_header
        meta_name = name.removeprefix("HTTP_").lower().replace("_", "-").encode()
        forwarded = headers.get(meta_name)
        if forwarded:
            first = forwarded[0].decode("latin-1").split(",", 1)[0].strip()
            scheme = "https" if first == secure_value else "http"
    host = None
    if settings.USE_X_FORWARDED_HOST:
        host = _one(headers, b"x-forwarded-host")
    host = host or _one(headers, b"host")
    if not host:
        return None
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    return normalise_origin(f"{scheme}://{host}")


def allowed_origins() -> frozenset[str]:
    """``WEBSOCKET_ALLOWED_ORIGINS``, each a full origin (``https://console.example.com:8443``);
    an entry that is not one stops the start naming the setting."""
    out = set()
    for entry in settings.WEBSOCKET_ALLOWED_ORIGINS:
        origin = normalise_origin(entry)
        if origin is None:
            raise ImproperlyConfigured(
                f"WEBSOCKET_ALLOWED_ORIGINS: {entry!r} is not an origin; give scheme, host and "
                "port if not the default, e.g. https://console.example.com:8443"
            )
        out.add(origin)
    return frozenset(out)


class OriginValidator:
    """Refuse websockets whose Origin is not exactly this console's (cross-site websocket
    hijacking): scheme, host and port must equal the request's own origin (``own_origin``) or
    one of ``WEBSOCKET_ALLOWED_ORIGINS``. A missing, repeated or "null" Origin is refused.

    Channels' ``AllowedHostsOriginValidator`` compares hosts only: a page on
    ``http://localhost:9999`` (any local process) could open the console's socket on port 8000
    with the customer's cookies. Refused handshakes close before routing (HTTP 403).
    """

    def __init__(self, application: Any) -> None:
        self.application = application
        self.allowed = allowed_origins()

    def origin_allowed(self, scope: dict[str, Any]) -> bool:
        origin = _one(_headers(scope), b"origin")
        normalised = normalise_origin(origin) if origin else None
        if normalised is None:
            return False
        return normalised in self.allowed or normalised == own_origin(scope)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not self.origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)


def websocket_router() -> URLRouter:
    """Every app's routes, then a catch-all: an unknown path closes with 4404, not a 500."""
    return URLRouter(
        [*websocket_urlpatterns, re_path(r"", consumers.UnknownPathConsumer.as_asgi())]
    )
