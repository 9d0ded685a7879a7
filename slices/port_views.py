"""The port proxy's views and websocket consumer (issue 19), thin: parse, check access through
``slices.services.ports``, open the driver's tunnel, relay with ``slices.proxy``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.security.websocket import WebsocketDenier
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
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from console import sites
from console.tenancy import acting
from slices.drivers import DriverError, get_driver
from slices.errors import OrderRefused
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


# The console's own cookies never reach an app (and an app may not set them); nor does the app
# host's own grant cookie (the app would learn a visitor's grant).
def _console_cookies() -> frozenset[str]:
    return frozenset(
        {
            settings.SESSION_COOKIE_NAME,
            settings.CSRF_COOKIE_NAME,
            settings.LANGUAGE_COOKIE_NAME,
            "messages",
        }
    )


def _not_forwarded() -> frozenset[str]:
    return _console_cookies() | {ports.APP_COOKIE}


# Response headers an app may not send through the proxy (issue 29): a service worker's scope
# beyond its path, wiping the browser's data for the site.
_DROPPED_HEADERS = frozenset({"service-worker-allowed", "clear-site-data"})


def _cookie_flags(request: HttpRequest) -> dict[str, Any]:
    return {"httponly": True, "samesite": "Lax", "secure": request.is_secure()}


# ---------------------------------------------------------------------------------------------
# HTTP through the proxy
# ---------------------------------------------------------------------------------------------


async def _request_body(request: HttpRequest) -> AsyncIterator[bytes]:
    # Django has the body in a spooled file (memory up to FILE_UPLOAD_MAX_MEMORY_SIZE, then
    # disk): read it in pieces, off the event loop.
    while chunk := await asyncio.to_thread(request.read, 256 * 1024):
        yield chunk


def _upstream_target(request: HttpRequest, access: proxy.Access) -> str:
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
    if access.instance.access_token and not request.headers.get("Authorization"):
        # JupyterLab's token (the instance's secret): the console vouches for whoever it let in.
        extra.append(("Authorization", f"token {access.instance.access_token}"))
    return forward_headers(fixed, drop_cookies=_not_forwarded(), extra=extra)


def headers_for_api(request: HttpRequest) -> list[tuple[str, str]]:
    """An app API request's headers (issue 20): the bearer key goes on (the app checks it too),
    the console's cookies do not."""
    raw = [(k, str(v)) for k, v in request.headers.items()]
    extra = [
        ("X-Forwarded-Proto", request.scheme or "http"),
        ("X-Forwarded-Host", request.get_host()),
    ]
    return forward_headers(raw, drop_cookies=_not_forwarded(), extra=extra)


class OffOrigin(Exception):  # noqa: N818 - the event
    """The app redirected off its own origin."""


def app_location(value: str, own_origin: str, port: int) -> str:
    """An app's ``Location`` on its app host: a path stays, its own origin stays, the app's view
    of itself (``http://127.0.0.1:<port>/...``) becomes a path; anything else leaves the app's
    origin through the console's proxy and is refused (``OffOrigin``)."""
    text = value.strip()
    if "\\" in text or any(ord(c) < 0x20 for c in text):
        raise OffOrigin(value)
    if text.startswith("/") and not text.startswith("//"):
        return text
    parts = urlsplit(text)
    if not parts.scheme and not parts.netloc:
        return text  # relative to the current path
    rest = urlunsplit(("", "", parts.path or "/", parts.query, parts.fragment))
    if f"{parts.scheme}://{parts.netloc}".lower() == own_origin.lower():
        return rest
    try:
        upstream_port = parts.port
    except ValueError:
        raise OffOrigin(value) from None
    if (
        parts.scheme in ("http", "https")
        and (parts.hostname or "") in ("127.0.0.1", "localhost")
        and upstream_port == port
    ):
        return rest
    raise OffOrigin(value)


def _response(
    upstream: Any, access: proxy.Access, request: HttpRequest, *, on_console: bool = False
) -> HttpResponseBase:
    """The app's response for the browser. On its app host the app's own headers stand (not the
    console's CSP or frame policy), less what no app may send through the console: cookies for
    a wider domain or with the console's names, a service worker's scope, Clear-Site-Data, a
    redirect off its origin. ``on_console``: an AI app's API answered on the console's origin,
    sandboxed so that nothing it returns runs there."""
    response = StreamingHttpResponse(upstream.body, status=upstream.status)
    del response["Content-Type"]
    cookies: list[str] = []
    for name, value in upstream.headers:
        low = name.lower()
        if low == "set-cookie":
            cookies.append(value)
        elif low in _DROPPED_HEADERS:
            continue
        elif low == "location":
            if not access.keep_prefix:
                if value.startswith("/") and not value.startswith("//"):
                    response[name] = access.prefix + value
                continue  # the API's redirects stay on its prefix
            try:
                response[name] = app_location(value, _own_origin(request), access.port)
            except OffOrigin:
                return HttpResponse(
                    _("The app redirected away from its own address; the console did not follow."),
                    status=502,
                    content_type="text/plain; charset=utf-8",
                )
        elif low in response.headers:
            response[name] = f"{response[name]}, {value}"
        else:
            response[name] = value
    if not on_console:
        forbidden = _not_forwarded()
        for line in cookies:
            jar = SimpleCookie()
            with contextlib.suppress(CookieError):
                jar.load(line)
            for key, morsel in jar.items():
                if key in forbidden or key.startswith("gpc_") or morsel["domain"]:
                    continue  # host-only cookies of the app's own names only
                response.cookies[key] = morsel
        response._csp_exempt = True  # type: ignore[attr-defined]
        response.xframe_options_exempt = True  # type: ignore[attr-defined]
    else:
        response["Content-Security-Policy"] = "sandbox; default-src 'none'"
        response["X-Content-Type-Options"] = "nosniff"
    return response


def _unavailable(port: int) -> HttpResponse:
    text = _("Nothing answers on port %(port)d of this instance yet.") % {"port": port}
    return HttpResponse(text, status=502, content_type="text/plain; charset=utf-8")


def _not_found() -> HttpResponse:
    text = _(
        "Nothing here: this address is not open to you (or no longer is). Open the port again from its instance page in the console."
    )
    response = HttpResponse(text, status=404, content_type="text/plain; charset=utf-8")
    response["Cache-Control"] = "no-store"
    return response


async def app_host_proxy(request: HttpRequest, public_id: str, port: int) -> HttpResponseBase:
    """Every request to an app host ``<id>-<port>.<APPS_DOMAIN>`` (``slices.apphosts`` routes
    it here, before the console's own middleware and URLs).

    Not Django's CSRF token (the app's own requests cannot carry it; the app keeps its own
    XSRF defences): a state-changing request from another site is refused by its Origin (or,
    without one, its Referer) before anything reaches the app, since the proxy authenticates the
    app on the owner's behalf."""
    if request.path == "/__gpc/auth":
        return await sync_to_async(_app_host_login)(request, public_id, port)
    if request.path == "/__gpc/edge-auth":
        from slices import edge_views  # the production edge's question (issue 34)

        return await sync_to_async(edge_views.edge_auth)(request, public_id, port)
    if request.method not in SAFE_METHODS and not _same_origin(request):
        return HttpResponseForbidden(b"cross-site request refused", content_type="text/plain")
    try:
        access = await sync_to_async(proxy.resolve_access)(
            public_id, port, request.COOKIES.get(ports.APP_COOKIE, "")
        )
    except Http404:
        return _not_found()
    upstream = await relay(request, access, _headers_for_app(request, access))
    if upstream is None:
        return _unavailable(port)
    return _response(upstream, access, request)


def port_proxy(request: HttpRequest, public_id: Any, port: int, rest: str = "") -> HttpResponse:
    """The console's own route of a port: never the app (issue 29), only a redirect to the Open
    button's hand-off, which takes the owner to the app host. Anyone else gets 404, as for an
    instance that does not exist."""
    if not request.user.is_authenticated:
        raise Http404
    instance = get_instance_for_user(acting(request), public_id)
    if not ports.is_open(instance, port):
        raise Http404
    target = reverse("slices:instance-port-open", kwargs={"public_id": public_id, "port": port})
    path = "/" + rest
    query = request.META.get("QUERY_STRING", "")
    return redirect(f"{target}?{urlencode({'next': path + ('?' + query if query else '')})}")


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


def _safe_next(value: str) -> str:
    if not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


def _app_host_login(request: HttpRequest, public_id: Any, port: int) -> HttpResponseBase:
    """The app host's half of the hand-off: the console's one-time signed ticket becomes this
    host's own cookie (host-only: no other host is sent it)."""
    instance = ports.running_instance(public_id)
    grant = ports.claim_handoff(request.GET.get("t", ""), instance, port) if instance else None
    if grant is None:
        return _not_found()
    response = HttpResponseRedirect(_safe_next(request.GET.get("next", "/")))
    response.set_cookie(
        ports.APP_COOKIE,
        ports.app_cookie_value(grant),
        max_age=ports.APP_COOKIE_SECONDS,
        path="/",
        **_cookie_flags(request),
    )
    response["Referrer-Policy"] = "no-referrer"
    response["Cache-Control"] = "no-store"
    return response


# ---------------------------------------------------------------------------------------------
# The console's own pages: open, share, revoke
# ---------------------------------------------------------------------------------------------


def _handoff_redirect(request: HttpRequest, instance: Any, port: int, token: str) -> HttpResponse:
    next_path = _safe_next(request.GET.get("next", "/"))
    response = redirect(ports.handoff_url(instance, port, token, next_path, request=request))
    response["Referrer-Policy"] = "no-referrer"
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_GET
def port_open(request: HttpRequest, public_id: Any, port: int) -> HttpResponse:
    """The Open button: to the port's own host, through a one-time signed hand-off."""
    # Opening a web port acts on the instance: its maker or a team admin (issue 30).
    instance = get_instance_for_user(acting(request), public_id, operate=True)
    if not ports.is_open(instance, port):
        raise Http404
    token = ports.handoff_token(instance, port, user_id=request.user.pk, link_id=None)
    return _handoff_redirect(request, instance, port, token)


@require_GET
def port_share(request: HttpRequest, secret: str) -> HttpResponse:
    """A share link: whoever holds it opens its one port on the app host, until it expires, the
    owner revokes it, or the instance stops."""
    link = ports.share_link_for_secret(secret)
    if link is None:
        raise Http404
    token = ports.handoff_token(link.instance, link.port, user_id=None, link_id=link.pk)
    return _handoff_redirect(request, link.instance, link.port, token)


def _ports_part(
    request: HttpRequest,
    instance: Any,
    new_share: dict[str, Any] | None = None,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    context = {
        "instance": instance,
        "new_share": new_share,
        "share_error": error,
        "share_lifetimes": ports.SHARE_LIFETIMES,
        "default_lifetime": ports.DEFAULT_SHARE_LIFETIME,
    }
    if getattr(request, "htmx", None):
        return render(request, "slices/_instance_ports.html", context, status=status)
    return render(request, "slices/instance_ports.html", context, status=status)


@login_required
@require_POST
def share_link_create(request: HttpRequest, public_id: Any, port: int) -> HttpResponse:
    instance = get_instance_for_user(acting(request), public_id)
    if not ports.is_open(instance, port):
        raise Http404
    try:
        link, secret = ports.create_share_link(
            acting(request), instance, port, request.POST.get("lifetime")
        )
    except OrderRefused as exc:
        return _ports_part(request, instance, error=str(exc), status=400)
    url = request.build_absolute_uri(ports.share_url(secret))
    new = {"port": port, "url": url, "id": link.pk, "expires_at": link.expires_at}
    return _ports_part(request, instance, new)


@login_required
@require_POST
def share_link_revoke(request: HttpRequest, public_id: Any, link_id: int) -> HttpResponse:
    instance = get_instance_for_user(acting(request), public_id)
    ports.revoke_share_link(acting(request), instance, link_id)
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
        if not self.scope.get("gpc_app_host"):
            # The console's own host never relays an app (issue 29): only its app host does.
            await self.close(code=4404)
            return
        cookie = self.scope.get("cookies", {}).get(ports.APP_COOKIE, "")
        try:
            access = await database_sync_to_async(proxy.resolve_access)(
                kwargs["public_id"], port, cookie
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

    def _target(self, access: proxy.Access) -> str:
        query = self.scope.get("query_string", b"").decode("latin-1")
        path = str(self.scope.get("gpc_app_path") or "/")
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
        return forward_headers(kept, drop_cookies=_not_forwarded(), extra=extra)

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
    """ASGI, in front of everything: a request to a host under ``APPS_DOMAIN`` never reaches the
    console. HTTP is marked so that the API's own handler leaves it to Django, where
    ``slices.apphosts.AppHostMiddleware`` answers it first; a websocket to an app host
    ``<id>-<port>.<APPS_DOMAIN>`` is routed to the port proxy's consumer (its own cookie; never
    the console's session, which that host is never sent), any other host under the domain is
    refused."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope.get("type") in ("http", "websocket"):
            host = next((v for k, v in scope.get("headers", []) if k == b"host"), b"")
            name = host.decode("latin-1")
            if sites.under_apps_domain(name, ports.apps_domain()):
                if scope["type"] == "http":
                    scope = {**scope, "gpc_app_host": True}
                else:
                    found = ports.parse_app_host(name)
                    if found is None:
                        return await WebsocketDenier()(scope, receive, send)
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
            elif scope["type"] == "websocket":
                scope = {
                    k: v for k, v in scope.items() if k not in ("gpc_app_host", "gpc_app_path")
                }
        return await self.application(scope, receive, send)
