"""The port proxy's views and websocket consumer (issue 19), thin: parse, check access through
``slices.services.ports``, open the driver's tunnel, relay with ``slices.proxy``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from http.cookies import CookieError, SimpleCookie
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseForbidden,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from slices.drivers import DriverError, get_driver
from slices.proxy import (
    AsyncTunnel,
    TunnelClosed,
    UpstreamResponse,
    UpstreamWebsocket,
    forward_headers,
    http_request,
)
from slices.services import ports, proxy
from slices.services.instances import get_instance_for_user


# The console's own cookies never reach an app (and an app may not set them).
def _console_cookies() -> frozenset[str]:
    return frozenset(
        {
            settings.SESSION_COOKIE_NAME,
            settings.CSRF_COOKIE_NAME,
            settings.LANGUAGE_COOKIE_NAME,
            "messages",
        }
    )


def _scope(request: HttpRequest) -> dict[str, Any]:
    return dict(getattr(request, "scope", None) or {})


def _app_host(request: HttpRequest) -> bool:
    return bool(_scope(request).get("gpc_app_host"))


def _cookie_flags() -> dict[str, Any]:
    return {"httponly": True, "samesite": "Lax", "secure": bool(settings.SESSION_COOKIE_SECURE)}


# ---------------------------------------------------------------------------------------------
# HTTP through the proxy
# ---------------------------------------------------------------------------------------------


async def _request_body(request: HttpRequest) -> AsyncIterator[bytes]:
    # Django has the body in a spooled file (memory up to FILE_UPLOAD_MAX_MEMORY_SIZE, then
    # disk): read it in pieces, off the event loop.
    while chunk := await asyncio.to_thread(request.read, 256 * 1024):
        yield chunk


def _upstream_target(request: HttpRequest, access: proxy.Access) -> str:
    scope = _scope(request)
    if scope.get("gpc_app_host"):
        path = str(scope.get("gpc_app_path") or "/")
        query = request.META.get("QUERY_STRING", "")
        return path + (f"?{query}" if query else "")
    full = request.get_full_path()
    if access.keep_prefix:
        return full
    rest = full[len(access.prefix) :]
    return rest if rest.startswith("/") else "/" + rest


def _own_origin(request: HttpRequest) -> str:
    return f"{request.scheme}://{request.get_host()}"


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _same_origin(request: HttpRequest) -> bool:
    """The request comes from this origin: its Origin says so, or (browsers that send none on a
    same-origin request) its Referer does; a request with neither is a script's, not a page's."""
    own = _own_origin(request)
    origin = request.headers.get("Origin")
    if origin is not None:
        return origin == own
    referer = request.headers.get("Referer")
    return referer is None or referer == own or referer.startswith(own + "/")


def _headers_for_app(request: HttpRequest, access: proxy.Access) -> list[tuple[str, str]]:
    raw = [(k, str(v)) for k, v in request.headers.items()]
    # The app sees requests from itself (its own origin checks pass); the console checked who
    # asked. A cross-site Origin is passed on as it is, for the app to refuse.
    upstream = f"http://127.0.0.1:{access.port}"
    fixed = []
    for name, value in raw:
        if name.lower() == "origin" and value == _own_origin(request):
            value = upstream
        if name.lower() == "referer" and value.startswith(_own_origin(request) + "/"):
            value = upstream + value[len(_own_origin(request)) :]
        fixed.append((name, value))
    extra: list[tuple[str, str]] = [
        ("X-Forwarded-Proto", request.scheme or "http"),
        ("X-Forwarded-Host", request.get_host()),
    ]
    if not access.keep_prefix:
        extra.append(("X-Forwarded-Prefix", access.prefix))
    if access.instance.access_token and not request.headers.get("Authorization"):
        # JupyterLab's token (the instance's secret): the console vouches for whoever it let in.
        extra.append(("Authorization", f"token {access.instance.access_token}"))
    return forward_headers(fixed, drop_cookies=_console_cookies(), extra=extra)


def headers_for_api(request: HttpRequest) -> list[tuple[str, str]]:
    """An app API request's headers (issue 20): the bearer key goes on (the app checks it too),
    the console's cookies do not."""
    raw = [(k, str(v)) for k, v in request.headers.items()]
    extra = [
        ("X-Forwarded-Proto", request.scheme or "http"),
        ("X-Forwarded-Host", request.get_host()),
    ]
    return forward_headers(raw, drop_cookies=_console_cookies(), extra=extra)


def _response(upstream: Any, access: proxy.Access) -> StreamingHttpResponse:
    response = StreamingHttpResponse(upstream.body, status=upstream.status)
    del response["Content-Type"]
    cookies: list[str] = []
    for name, value in upstream.headers:
        low = name.lower()
        if low == "set-cookie":
            cookies.append(value)
        elif low == "location" and not access.keep_prefix and value.startswith("/"):
            response[name] = value if value.startswith("//") else access.prefix + value
        elif low in response.headers:
            response[name] = f"{response[name]}, {value}"
        else:
            response[name] = value
    console = _console_cookies()
    for line in cookies:
        jar = SimpleCookie()
        with contextlib.suppress(CookieError):
            jar.load(line)
        for key, morsel in jar.items():
            if key in console or key.startswith("gpc_"):
                continue  # an app may not replace the console's cookies
            response.cookies[key] = morsel
    # The app's own headers stand: not the console's CSP or frame policy.
    response._csp_exempt = True  # type: ignore[attr-defined]
    response.xframe_options_exempt = True  # type: ignore[attr-defined]
    return response


def _unavailable(port: int) -> HttpResponse:
    text = _("Nothing answers on port %(port)d of this instance yet.") % {"port": port}
    return HttpResponse(text, status=502, content_type="text/plain; charset=utf-8")


async def _credentials(request: HttpRequest, port: int) -> proxy.Credentials:
    if _app_host(request):
        return proxy.Credentials(
            app_host=True, app_cookie=request.COOKIES.get(ports.APP_COOKIE, "")
        )
    user = await request.auser()
    share = request.COOKIES.get(ports.SHARE_COOKIE.format(port=port), "")
    return proxy.Credentials(user=user, share_secret=share)


@csrf_exempt
async def port_proxy(
    request: HttpRequest, public_id: Any, port: int, rest: str = ""
) -> HttpResponseBase:
    """Everything under ``/instances/<id>/ports/<port>/`` (or an app host in subdomain mode).

    Not Django's CSRF token (the app's own requests cannot carry it; the app keeps its own
    XSRF defences): a state-changing request from another site is refused by its Origin (or,
    without one, its Referer) before anything reaches the app, since the proxy authenticates the
    app on the owner's behalf."""
    if _app_host(request) and _scope(request).get("gpc_app_path") == "/__gpc/auth":
        return await sync_to_async(_app_host_login)(request, public_id, port)
    if request.method not in SAFE_METHODS and not _same_origin(request):
        return HttpResponseForbidden(b"cross-site request refused", content_type="text/plain")
    creds = await _credentials(request, port)
    access = await sync_to_async(proxy.resolve_access)(public_id, port, creds)
    upstream = await relay(request, access, _headers_for_app(request, access))
    if upstream is None:
        return _unavailable(port)
    return _response(upstream, access)


async def relay(
    request: HttpRequest, access: proxy.Access, headers: list[tuple[str, str]]
) -> UpstreamResponse | None:
    """Send ``request`` to the app ``access`` names over the driver's tunnel (its body streamed);
    the app's response with its body still to stream, or None when nothing answers there. The
    port proxy and an AI app's API (``slices.app_views``) both relay through it."""
    driver: Any = get_driver(access.instance.driver or None)
    try:
        raw = await asyncio.to_thread(
            driver.open_tunnel, access.spec, access.node, access.node_port
        )
    except DriverError:
        return None
    length = request.META.get("CONTENT_LENGTH") or ""
    has_body = request.method not in ("GET", "HEAD", "OPTIONS", "DELETE") or length not in (
        "",
        "0",
    )
    try:
        return await http_request(
            AsyncTunnel(raw),
            method=request.method or "GET",
            target=_upstream_target(request, access),
            host=f"127.0.0.1:{access.port}",
            headers=headers,
            body=_request_body(request) if has_body else None,
            content_length=int(length) if length.isdigit() else (0 if has_body else None),
        )
    except TunnelClosed:
        return None


def _app_host_login(request: HttpRequest, public_id: Any, port: int) -> HttpResponseBase:
    """Subdomain mode: the console's signed hand-off becomes this host's own cookie."""
    instance = ports.running_instance(public_id)
    grant = ports.read_handoff(request.GET.get("t", ""), instance, port) if instance else None
    if instance is None or grant is None or not ports.grant_allows(grant, instance, port):
        raise Http404
    target = request.GET.get("next", "/")
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        target = "/"
    response = HttpResponseRedirect(target)
    response.set_cookie(
        ports.APP_COOKIE,
        ports.app_cookie_value(grant),
        max_age=ports.APP_COOKIE_SECONDS,
        path="/",
        **_cookie_flags(),
    )
    return response


# ---------------------------------------------------------------------------------------------
# The console's own pages: open, share, revoke
# ---------------------------------------------------------------------------------------------


@login_required
@require_GET
def port_open(request: HttpRequest, public_id: Any, port: int) -> HttpResponse:
    """The Open button: the port's URL (subdomain mode: through the signed hand-off)."""
    instance = get_instance_for_user(request.user, public_id)
    if not ports.is_open(instance, port):
        raise Http404
    if not ports.apps_domain():
        return redirect(ports.port_url(instance, port))
    token = ports.handoff_token(instance, port, user_id=request.user.pk, link_id=None)
    return redirect(ports.handoff_url(instance, port, token))


@require_GET
def port_share(request: HttpRequest, secret: str) -> HttpResponse:
    """A share link: whoever holds it opens its one port, until the owner revokes it."""
    link = ports.share_link_for_secret(secret)
    if link is None:
        raise Http404
    instance, port = link.instance, link.port
    if ports.apps_domain():
        token = ports.handoff_token(instance, port, user_id=None, link_id=link.pk)
        return redirect(ports.handoff_url(instance, port, token))
    response = redirect(ports.port_url(instance, port))
    response.set_cookie(
        ports.SHARE_COOKIE.format(port=port),
        secret,
        max_age=ports.APP_COOKIE_SECONDS,
        path=ports.port_path(instance, port),
        **_cookie_flags(),
    )
    response["Referrer-Policy"] = "no-referrer"
    return response


def _ports_part(
    request: HttpRequest, instance: Any, new_share: dict[str, Any] | None = None
) -> HttpResponse:
    context = {"instance": instance, "new_share": new_share}
    if getattr(request, "htmx", None):
        return render(request, "slices/_instance_ports.html", context)
    return render(request, "slices/instance_ports.html", context)


@login_required
@require_POST
def share_link_create(request: HttpRequest, public_id: Any, port: int) -> HttpResponse:
    instance = get_instance_for_user(request.user, public_id)
    if not ports.is_open(instance, port):
        raise Http404
    link, secret = ports.create_share_link(request.user, instance, port)
    url = request.build_absolute_uri(ports.share_url(secret))
    return _ports_part(request, instance, {"port": port, "url": url, "id": link.pk})


@login_required
@require_POST
def share_link_revoke(request: HttpRequest, public_id: Any, link_id: int) -> HttpResponse:
    instance = get_instance_for_user(request.user, public_id)
    ports.revoke_share_link(request.user, instance, link_id)
    if getattr(request, "htmx", None):
        return _ports_part(request, instance)
    return redirect("slices:instance-detail", public_id=instance.public_id)


# ---------------------------------------------------------------------------------------------
# Websockets (Jupyter's kernels)
# ---------------------------------------------------------------------------------------------


class PortProxyConsumer(AsyncWebsocketConsumer):
    """A websocket to an instance's port, relayed through the same tunnel as HTTP. Access is
    checked on connect, before anything is opened; refused handshakes close (the browser sees
    a failed handshake, as for an instance that does not exist)."""

    upstream: UpstreamWebsocket | None = None
    pump: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        kwargs = self.scope["url_route"]["kwargs"]
        port = int(kwargs["port"])
        creds = self._credentials(port)
        try:
            access = await database_sync_to_async(proxy.resolve_access)(
                kwargs["public_id"], port, creds
            )
        except Http404:
            await self.close(code=4404)
            return
        driver: Any = get_driver(access.instance.driver or None)
        try:
            raw = await asyncio.to_thread(
                driver.open_tunnel, access.spec, access.node, access.node_port
            )
        except DriverError:
            await self.close(code=4502)
            return
        upstream = UpstreamWebsocket(AsyncTunnel(raw))
        try:
            ok = await upstream.connect(
                f"127.0.0.1:{access.port}",
                self._target(access),
                self._headers(access),
                list(self.scope["subprotocols"]),
            )
        except (TunnelClosed, OSError):
            ok = False
        if not ok:
            await self.close(code=4502)
            return
        self.upstream = upstream
        await self.accept(subprotocol=upstream.subprotocol)
        self.pump = asyncio.create_task(self._pump())

    def _credentials(self, port: int) -> proxy.Credentials:
        cookies = self.scope.get("cookies", {})
        if self.scope.get("gpc_app_host"):
            return proxy.Credentials(app_host=True, app_cookie=cookies.get(ports.APP_COOKIE, ""))
        return proxy.Credentials(
            user=self.scope.get("user"),
            share_secret=cookies.get(ports.SHARE_COOKIE.format(port=port), ""),
        )

    def _target(self, access: proxy.Access) -> str:
        query = self.scope.get("query_string", b"").decode("latin-1")
        if self.scope.get("gpc_app_host"):
            path = str(self.scope.get("gpc_app_path") or "/")
        else:
            path = self.scope["path"]
            if not access.keep_prefix:
                path = path[len(access.prefix) :] or "/"
        return path + (f"?{query}" if query else "")

    def _headers(self, access: proxy.Access) -> list[tuple[str, str]]:
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.scope["headers"]]
        skip = {"origin", "host", "sec-websocket-key", "sec-websocket-version"}
        kept = [
            (k, v)
            for k, v in raw
            if k.lower() not in skip and not k.lower().startswith("sec-websocket")
        ]
        # The console's origin check passed (console.routing.OriginValidator): the app sees its own.
        extra = [("Origin", f"http://127.0.0.1:{access.port}")]
        if access.instance.access_token and not any(k.lower() == "authorization" for k, _ in kept):
            extra.append(("Authorization", f"token {access.instance.access_token}"))
        return forward_headers(kept, drop_cookies=_console_cookies(), extra=extra)

    async def _pump(self) -> None:
        assert self.upstream is not None
        try:
            async for text, data in self.upstream.messages():
                if text is not None:
                    await self.send(text_data=text)
                else:
                    await self.send(bytes_data=data)
        except (TunnelClosed, OSError):
            pass
        with contextlib.suppress(Exception):
            await self.close()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.upstream is not None:
            try:
                await self.upstream.send(text_data, bytes_data)
            except TunnelClosed:
                await self.close()

    async def disconnect(self, code: int) -> None:
        if self.pump is not None:
            self.pump.cancel()
        if self.upstream is not None:
            await self.upstream.close()


# ---------------------------------------------------------------------------------------------
# Subdomain mode: an app host's requests go to the same proxy
# ---------------------------------------------------------------------------------------------


class AppHostRouter:
    """ASGI: a request to ``<id>-<port>.<APPS_DOMAIN>`` (HTTP or websocket) is routed to the
    proxy's path, marked as coming from an app host (its own cookie; never the console's
    session, which that host is never sent). Everything else passes through untouched."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope.get("type") in ("http", "websocket") and ports.apps_domain():
            host = next((v for k, v in scope.get("headers", []) if k == b"host"), b"")
            found = ports.parse_app_host(host.decode("latin-1"))
            if found is not None:
                public_id, port = found
                path = scope.get("path") or "/"
                proxied = f"/instances/{public_id}/ports/{port}/{path.lstrip('/')}"
                scope = {
                    **scope,
                    "path": proxied,
                    "raw_path": proxied.encode(),
                    "gpc_app_host": True,
                    "gpc_app_path": path,
                }
        return await self.application(scope, receive, send)
