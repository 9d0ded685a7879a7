from __future__ import annotations

import math
import secrets
import sys
import time

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.shortcuts import render
from django.template import loader
from django.utils.translation import gettext as _
from django.views import defaults
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from console.api.exceptions import (
    RETRY_AFTER_SECONDS,
    TOO_LARGE,
    too_large_body,
    unavailable_response,
)
from console.auth import staff_required
from console.dashboard import build_dashboard, build_landing
from console.errors import ErrorCode
from console.events import notify_user
from console.retries import is_transient
from console.roles import Perm
from console.tasks import ping_worker_task
from console.tenancy import acting


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """The landing page for visitors, the dashboard for signed-in users."""
    if not request.user.is_authenticated:
        return render(request, "console/landing.html", {"landing": build_landing()})
    # The wallet of the team acted in, for whoever may see it (billing roles); others see their
    # own (personal) wallet, as the header's team switch says which team they act in.
    me = acting(request)
    who = me if me.can(Perm.BILLING) else request.user
    return render(request, "console/dashboard.html", {"dashboard": build_dashboard(who)})


FAVICON = settings.BASE_DIR / "static" / "console" / "favicon.ico"


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``, which browsers and crawlers ask for whatever the page's ``<link>`` says."""
    response = HttpResponse(FAVICON.read_bytes(), content_type="image/x-icon")
    response["Cache-Control"] = "public, max-age=86400"
    return response


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness + readiness: the database answers and the channel layer round-trips a message."""
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        checks["database"] = "ok"
    except Exception as exc:  # a health check reports every failure, whatever its type
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        checks["channel_layer"] = async_to_sync(_channel_layer_roundtrip)()
    except Exception as exc:
        checks["channel_layer"] = f"error: {type(exc).__name__}"
    healthy = all(v == "ok" for v in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "error", **checks}, status=200 if healthy else 503
    )


async def _channel_layer_roundtrip() -> str:
    import asyncio

    layer = get_channel_layer()
    channel = await layer.new_channel("healthz.")
    token = secrets.token_hex(8)
    async with asyncio.timeout(2):  # a Redis that hangs, not only one that refuses: 503
        await layer.send(channel, {"type": "healthz", "token": token})
        message = await layer.receive(channel)
    return "ok" if message.get("token") == token else "error: mismatch"


@staff_required
@require_GET
def diagnostics(request: HttpRequest) -> HttpResponse:
    return render(request, "console/diagnostics.html")


@staff_required
@require_POST
def diagnostics_ping(request: HttpRequest) -> HttpResponse:
    """Enqueue a worker round-trip; the result arrives over the notifications websocket."""
    token = request.POST.get("token") or secrets.token_hex(8)
    try:
        delay = float(request.POST.get("delay", "0.5"))
    except ValueError:
        delay = math.nan
    if not math.isfinite(delay) or not 0 <= delay <= 10:
        return JsonResponse(
            {"error": "invalid", "detail": "delay must be a number of seconds from 0 to 10"},
            status=400,
        )
    ping_worker_task.delay(request.user.pk, token, delay)
    if request.htmx:
        return render(request, "console/diagnostics.html#ping-sent", {"token": token})
    return JsonResponse({"queued": True, "token": token, "queued_at": time.time()}, status=202)


@staff_required
@require_POST
def diagnostics_broadcast(request: HttpRequest) -> JsonResponse:
    """Send a message through the channel layer from outside any consumer."""
    token = request.POST.get("token") or secrets.token_hex(8)
    notify_user(request.user.public_id, "diagnostic.broadcast", {"token": token})
    return JsonResponse({"sent": True, "token": token})


def _error(
    request: HttpRequest, status: int, code: ErrorCode, detail: str, context: dict | None = None
) -> HttpResponse:
    """The API's error body under /api/, the console's styled ``<status>.html`` page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": str(code), "detail": detail}, status=status)
    return render(request, f"{status}.html", context, status=status)


_NOT_FOUND_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.method not in _NOT_FOUND_METHODS:  # TRACE, CONNECT, made-up methods
        if request.path.startswith("/api/"):
            response = JsonResponse(
                {"error": str(ErrorCode.METHOD_NOT_ALLOWED), "detail": "Method not allowed."},
                status=405,
            )
            response["Allow"] = ", ".join(_NOT_FOUND_METHODS)
            return response
        return HttpResponseNotAllowed(_NOT_FOUND_METHODS)
    return _error(request, 404, ErrorCode.NOT_FOUND, "Not found.")


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Django's 400 for what it refuses before or while reading a request (a body over
    ``DATA_UPLOAD_MAX_MEMORY_SIZE``, a Host not in ``ALLOWED_HOSTS``). Under /api/ the API's
    error body: 413 ``too_large`` for a body over a limit, else 400 ``invalid``; pages keep
    Django's own 400."""
    if not request.path.startswith("/api/"):
        return defaults.bad_request(request, exception)  # type: ignore[arg-type]
    if isinstance(exception, TOO_LARGE):
        return JsonResponse(too_large_body(exception), status=413)
    return JsonResponse({"error": str(ErrorCode.INVALID), "detail": "Bad request."}, status=400)


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _error(
        request, 403, ErrorCode.PERMISSION_DENIED, _("You do not have permission to do this.")
    )


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """A form posted without a valid CSRF token (usually: the page was open for too long)."""
    detail = _("CSRF check failed: send the X-CSRFToken header, or use an API token.")
    return _error(request, 403, ErrorCode.PERMISSION_DENIED, detail, {"csrf_failed": True})


def too_many_requests(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Every rate limit outside the API (logins, sign-up, resets): allauth calls this too."""
    return _error(
        request, 429, ErrorCode.THROTTLED, _("Too many requests. Please wait and try again.")
    )


def server_error(request: HttpRequest) -> HttpResponse:
    """Django's 500, and the 503 of a transient error that no view caught: a page's view, or a
    middleware of any request (the session or user loaded from a database that was cut, the
    pool exhausted). Django calls this inside its ``except`` block, so ``sys.exc_info()`` has
    the error (asgiref carries it into the worker thread under ASGI); Django logs it."""
    exc = sys.exc_info()[1]
    if exc is not None and is_transient(exc):
        if request.path.startswith("/api/"):
            return unavailable_response()
        # Static, like the 500 page: no context processors, no database.
        response = HttpResponse(loader.get_template("503.html").render({}), status=503)
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "error", "detail": "Server error."}, status=500)
    # No context processors here: the failure may be in one of them.
    return HttpResponse(loader.get_template("500.html").render({}), status=500)
