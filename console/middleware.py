"""The console's own middleware: static files under ASGI, no caching of signed-in pages, a page
for a form's address opened by hand (405)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import IO

from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponseBase, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import Resolver404, resolve
from django.utils.cache import patch_cache_control
from whitenoise.middleware import WhiteNoiseMiddleware

CHUNK_SIZE = 64 * 1024


async def _read_chunks(handle: IO[bytes] | None) -> AsyncIterator[bytes]:
    """A file as an asynchronous iterator; the reads run in a thread, off the event loop."""
    if handle is None:  # HEAD, 304: headers only
        return
    try:
        while chunk := await asyncio.to_thread(handle.read, CHUNK_SIZE):
            yield chunk
    finally:
        handle.close()


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise, with an asynchronous body under ASGI.

    WhiteNoise answers with a ``FileResponse`` over a plain file; Django's ASGI handler can only
    consume that by reading it whole in a thread, and warns ("StreamingHttpResponse must consume
    synchronous iterators") on every static request. Under ASGI we hand it an async iterator
    instead; under WSGI WhiteNoise's own response is the right one.
    """

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if not isinstance(request, ASGIRequest):
            return super().__call__(request)
        static_file = (
            self.find_file(request.path_info)
            if self.autorefresh
            else self.files.get(request.path_info)
        )
        if static_file is None:
            return self.get_response(request)
        served = static_file.get_response(request.method, request.META)
        response = StreamingHttpResponse(_read_chunks(served.file), status=int(served.status))
        del response["Content-Type"]  # WhiteNoise's headers say what it is
        for key, value in served.headers:
            response[key] = value
        return response


class PrivatePagesMiddleware:
    """Responses for a signed-in user are never stored by shared caches or the browser's history.

    A page with a balance, SSH keys or an API token must not be served to the next person on a
    shared computer from the back button or a proxy cache: ``Cache-Control: private, no-store``.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            patch_cache_control(response, private=True, no_store=True)  # also drops "public"
        return response


def holding_page(path: str) -> str:
    """The nearest page above ``path`` that the console serves (``/instances/<id>/stop/`` ->
    ``/instances/<id>/``): where the form that posts to ``path`` lives; "/" when none does."""
    parts = [p for p in path.split("/") if p]
    while parts:
        parts.pop()
        candidate = "/" + "".join(f"{p}/" for p in parts)
        try:
            resolve(candidate)
        except Resolver404:
            continue
        return candidate
    return "/"


class MethodNotAllowedPageMiddleware:
    """A browser that opens the address of a POST-only view (a bookmark, a reload after a
    redirect, a link copied from the address bar) gets a page, not Django's empty 405: it says
    the address takes a form's submission and links the page that holds the form. The status
    stays 405 with its ``Allow`` header; the API (``/api/``, JSON 405 from DRF) is left alone."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        if (
            response.status_code != 405
            or request.method not in ("GET", "HEAD")
            or request.path_info.startswith("/api/")
            or getattr(response, "streaming", False)
            or getattr(response, "content", b"")
        ):
            return response
        page = TemplateResponse(
            request,
            "405.html",
            {"holding_page": holding_page(request.path_info)},
            status=405,
        )
        if response.has_header("Allow"):
            page["Allow"] = response["Allow"]
        return page.render()


class TeamDoorMiddleware:
    """The role check at every door of the pages (issue 30): a request acts in a team
    (console/tenancy.py) and a write needs the role's permission for the app it goes to
    (console/roles.door_perm); anything else is a 403 page, with nothing changed. The API has the
    same rule as a DRF permission (console/api/permissions.py), since its tokens are read there."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view_func: Callable[..., object], args: object, kwargs: object
    ) -> HttpResponseBase | None:
        from django.core.exceptions import PermissionDenied

        from console.roles import door_perm
        from console.tenancy import acting

        if request.path_info.startswith("/api/"):
            return None
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        match = request.resolver_match
        needed = door_perm(
            getattr(view_func, "__module__", "") or "",
            request.method or "GET",
            (match.url_name or "") if match else "",
        )
        if needed is None:
            return None
        if not acting(request).can(needed):
            raise PermissionDenied("role")
        return None
