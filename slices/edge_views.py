"""The console's answer to the edge's auth subrequest (issue 34), on an app host.

nginx (``deploy/nginx/console.conf.in``) sends every request to ``<id>-<port>.<APPS_DOMAIN>``
here first, without its body, as ``/__gpc/edge-auth`` with the edge's secret; the console keeps
every decision (the app host's grant cookie, share links, a cross-site write refused, the
instance's token for JupyterLab) and answers in headers:

- 200: allowed. ``X-Gpc-Upstream`` is ``unix:<socket>`` (nginx proxies the request there,
  with ``X-Gpc-Host``, ``X-Gpc-Origin``, ``X-Gpc-Cookie`` and ``X-Gpc-Authorization`` as the
  app's request headers) or ``console`` (nginx passes the request to the console, which relays
  it as in the embedded default, with the request's own headers);
- 401: not open to this browser (nginx answers the proxy's 404);
- 403: a cross-site write (nginx answers 403).

No decision is cached: each request asks (a signed cookie and three indexed reads), so a grant
ended at logout, a revoked link, a stop or a release refuses the very next request. Only where
the tunnel goes is kept, for two seconds and for the instance's present state
(``proxy.cached_tunnel_target``).
"""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse

from console import edge
from slices import port_views
from slices.services import edge as edge_service
from slices.services import ports, proxy


def _answer(status: int) -> HttpResponse:
    response = HttpResponse(b"", status=status, content_type="text/plain")
    response["Cache-Control"] = "no-store"
    # Said outright: app hosts are answered before CommonMiddleware, and without it uvicorn
    # frames even an empty body as chunked, which nginx must then read to its end before it
    # can reuse the kept-alive connection for the next subrequest.
    response["Content-Length"] = "0"
    return response


def edge_auth(request: HttpRequest, public_id: str, port: int) -> HttpResponse:
    if not edge.is_edge(request.headers.get(edge.SECRET_HEADER, "")):
        return port_views._not_found()  # noqa: SLF001 - the proxy's own 404
    method = request.headers.get("X-Gpc-Method", "GET").upper()
    if method not in port_views.SAFE_METHODS and not port_views._same_origin(request):  # noqa: SLF001
        return _answer(403)
    try:
        access = proxy.resolve_access(public_id, port, request.COOKIES.get(ports.APP_COOKIE, ""))
    except Http404:
        return _answer(401)
    response = _answer(200)
    socket = edge_service.upstream_socket(access)
    if socket is None:
        # The console relays: the request goes to it as the browser sent it.
        response["X-Gpc-Upstream"] = "console"
        response["X-Gpc-Host"] = request.get_host()
        response["X-Gpc-Origin"] = request.headers.get("Origin", "")
        response["X-Gpc-Cookie"] = request.headers.get("Cookie", "")
        response["X-Gpc-Authorization"] = request.headers.get("Authorization", "")
        return response
    # The app's own view of the request, as the embedded proxy sends it (port_views).
    headers = {
        name.lower(): value
        for name, value in port_views._headers_for_app(request, access)  # noqa: SLF001
        if name.lower() in ("origin", "authorization", "cookie")
    }
    response["X-Gpc-Upstream"] = f"unix:{socket}"
    response["X-Gpc-Host"] = f"127.0.0.1:{access.port}"
    response["X-Gpc-Origin"] = headers.get("origin", "")
    response["X-Gpc-Cookie"] = headers.get("cookie", "")  # without the console's and gpc_
    response["X-Gpc-Authorization"] = headers.get("authorization", "")
    return response
