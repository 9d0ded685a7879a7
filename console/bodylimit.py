"""Request bodies capped by route before Django reads them (issue 29).

Django's ASGI handler receives a request's whole body (into memory, then a temporary file past
``FILE_UPLOAD_MAX_MEMORY_SIZE``) before any middleware or view runs, so its own limits
(``DATA_UPLOAD_MAX_MEMORY_SIZE``, the /pfs upload's size check) came after the bytes were on the
console's disk: an anonymous 300 MB chunked POST to the sign-in page was received whole.
``RequestBodyLimit`` sits in front of Django as ASGI middleware and decides per request, from its
path, how many bytes it may carry (``REQUEST_BODY_LIMITS``, else ``REQUEST_BODY_MAX_BYTES``):

- a ``Content-Length`` over the limit is answered 413 at once, without reading a byte of it;
- a body without one (chunked) is counted as it streams; once past the limit the application is
  told the client went away (``http.disconnect``: Django drops what it read) and the client gets
  the 413, unless the application had already started its answer (a streaming proxy), which then
  just ends.

The 413 is the API's JSON error body under ``/api/`` (``{"error": "too_large", ...}``) and a short
page elsewhere, in the language of the ``django_language`` cookie or ``Accept-Language``.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

API_PREFIX = "/api/"


@lru_cache(maxsize=8)
def _compiled(limits: tuple[tuple[str, int], ...]) -> tuple[tuple[re.Pattern[str], int], ...]:
    return tuple((re.compile(pattern), int(limit)) for pattern, limit in limits)


def _path(scope: Scope) -> str:
    path: str = scope.get("path") or "/"
    root: str = scope.get("root_path") or ""
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return path


def limit_for(path: str) -> int:
    """The most bytes a request to ``path`` may carry: the first of ``REQUEST_BODY_LIMITS`` whose
    pattern matches the path from its start, else ``REQUEST_BODY_MAX_BYTES``."""
    for pattern, limit in _compiled(tuple(tuple(x) for x in settings.REQUEST_BODY_LIMITS)):
        if pattern.match(path):
            return limit
    return int(settings.REQUEST_BODY_MAX_BYTES)


def _header(scope: Scope, name: bytes) -> list[bytes]:
    return [v for k, v in scope.get("headers") or () if k.lower() == name]


def declared_length(scope: Scope) -> int | None:
    """The request's ``Content-Length`` when it has exactly one that is a number, else None
    (a malformed one is the server's and Django's to refuse; the count below still holds)."""
    values = _header(scope, b"content-length")
    if len(values) != 1 or not values[0].strip().isdigit():
        return None
    return int(values[0].strip())


def _language(scope: Scope) -> str:
    supported = {code for code, _name in settings.LANGUAGES}
    for cookie in _header(scope, b"cookie"):
        for part in cookie.decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == settings.LANGUAGE_COOKIE_NAME and value.lower() in supported:
                return value.lower()
    for accept in _header(scope, b"accept-language"):
        for item in accept.decode("latin-1").split(","):
            tag = item.split(";")[0].strip().lower()
            for code in supported:
                if tag == code or tag.split("-")[0] == code.split("-")[0]:
                    return code
    return str(settings.LANGUAGE_CODE)


def too_large_response(scope: Scope, limit: int) -> tuple[bytes, bytes]:
    """The 413's content type and body (the API's JSON error body under /api/)."""
    with translation.override(_language(scope)):
        detail = gettext("The request body is larger than %(limit)s bytes.") % {"limit": limit}
        if _path(scope).startswith(API_PREFIX):
            body = {"error": "too_large", "detail": detail, "limit": limit}
            return b"application/json", json.dumps(body, ensure_ascii=False).encode()
        title = gettext("Request too large")
    page = (
        f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(detail)}</p>\n"
    )
    return b"text/html; charset=utf-8", page.encode()


async def send_too_large(scope: Scope, send: Send, limit: int) -> None:
    content_type, body = too_large_response(scope, limit)
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class RequestBodyLimit:
    """ASGI middleware: every HTTP request's body within its route's limit (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        # An app host's request (marked by slices.port_views.AppHostRouter, in front) is the
        # port proxy's, whatever its path.
        limit = (
            int(settings.PORT_PROXY_BODY_MAX_BYTES)
            if scope.get("gpc_app_host")
            else limit_for(_path(scope))
        )
        length = declared_length(scope)
        if length is not None and length > limit:
            await send_too_large(scope, send, limit)
            return
        received = 0
        over = False
        started = False

        async def counted() -> Message:
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body") or b"")
                if received > limit:
                    over = True  # nothing more is read from the client
                    return {"type": "http.disconnect"}
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if message.get("type") == "http.response.start":
                if over:
                    return  # the client gets the 413 below, not a half-answered request
                started = True
            if over and not started:
                return
            await send(message)

        await self.app(scope, counted, watched)
        if over and not started:
            await send_too_large(scope, send, limit)
