"""The app hosts in front of the console (issue 29): the first middleware.

A request whose host is under ``APPS_DOMAIN`` never reaches the console's middleware, sessions or
URLs: an app host ``<id>-<port>.<APPS_DOMAIN>`` goes straight to the port proxy
(``slices.port_views.app_host_proxy``), any other name under the domain answers 404, and the
domain's bare name (``localhost`` in the embedded default) sends the browser on to the console
at ``127.0.0.1`` in the embedded default (404 in production). Every other host is the console's.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect

from console import sites
from slices import port_views
from slices.services import ports


def _host(request: HttpRequest) -> str:
    meta = request.META
    if settings.USE_X_FORWARDED_HOST and "HTTP_X_FORWARDED_HOST" in meta:
        return str(meta["HTTP_X_FORWARDED_HOST"]).split(",")[0].strip()
    return str(meta.get("HTTP_HOST") or meta.get("SERVER_NAME") or "")


def _not_found() -> HttpResponse:
    response = HttpResponse(
        b"404: no app is served at this address.\n",
        status=404,
        content_type="text/plain; charset=utf-8",
    )
    response["Cache-Control"] = "no-store"
    return response


def route(request: HttpRequest) -> HttpResponseBase | tuple[str, int] | None:
    """None for the console's own hosts; the app host's ``(public_id, port)``; or the answer
    for any other name under ``APPS_DOMAIN``."""
    host = _host(request)
    domain = ports.apps_domain()
    if not sites.under_apps_domain(host, domain):
        return None
    found = sites.parse_app_host(host, domain)
    if found is not None:
        return found
    if sites.hostname(host) == domain and settings.EMBEDDED:
        # http://localhost:8000/ in the embedded default: the console is at 127.0.0.1.
        port = host.rsplit(":", 1)[1] if host.count(":") == 1 else ""
        netloc = f"127.0.0.1:{port}" if port.isdigit() else "127.0.0.1"
        return HttpResponseRedirect(f"{request.scheme}://{netloc}{request.get_full_path()}")
    return _not_found()


class AppHostMiddleware:
    """First in ``MIDDLEWARE``: app hosts are answered here, everything else passes on."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        decision = route(request)
        if decision is None:
            return self.get_response(request)
        if isinstance(decision, HttpResponseBase):
            return decision
        return async_to_sync(port_views.app_host_proxy)(request, *decision)

    async def __acall__(self, request: HttpRequest) -> Any:
        decision = route(request)
        if decision is None:
            return await self.get_response(request)
        if isinstance(decision, HttpResponseBase):
            return decision
        return await port_views.app_host_proxy(request, *decision)
