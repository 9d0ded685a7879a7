"""Django's ASGI handler, with an API request served in one hop to a long-lived thread (issue 22).

Under ASGI, Django gives every request a thread of its own (``ThreadSensitiveContext``: a new
executor, so a thread started and joined per request), sends the ``request_started`` signal to
it, runs the middleware chain in async mode (adapting each sync-only piece with another hop),
runs the view, then closes the response in a last hop: about ten thread hops and one thread start
per request, 1-2 ms of CPU, for views that are all synchronous. The API's requests (``/api/``:
DRF, every view synchronous) are served instead by the same middleware, loaded in synchronous
mode, and the view, all in one call on a thread of a fixed pool, as a WSGI server would run them:
the started signal, the request, the middleware and view, then the response closed (the finished
signal, which hands the thread's database connection back to the pool) before its bytes are sent.
The same code runs in the same order; the thread's database connection is its own
(``connections`` is thread-local), as under WSGI.

The pool has ``API_THREADS`` threads (3); more requests queue for a thread, ``API_QUEUE_TIMEOUT``
seconds at most (``DB_POOL_TIMEOUT``'s 10 by default): then 503 with ``Retry-After``, as a request
that waited that long for a database connection answers. Under one GIL the views' CPU does not
grow with threads, while every runnable thread delays the event loop that sends the answers and
the websockets' messages. Every other path (pages, the port proxy's asynchronous views, static
files) keeps Django's own handling.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import io
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import HttpResponse, HttpResponseBase
from django.urls import set_script_prefix
from django.utils import translation
from django.utils.translation import get_language_from_request

API_PREFIX = "/api/"


def is_api_scope(scope: dict[str, Any]) -> bool:
    """Whether an ASGI scope is an HTTP request for the API (its path below the root path)."""
    if scope["type"] != "http" or scope.get("gpc_app_host"):
        return False  # an app host's /api/ is the app's (slices.port_views.AppHostRouter)
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path.startswith(API_PREFIX)


class ConsoleASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        self._sync = BaseHandler()
        self._sync.load_middleware(is_async=False)
        self._threads = ThreadPoolExecutor(
            max_workers=settings.API_THREADS, thread_name_prefix="api"
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not is_api_scope(scope):
            await super().__call__(scope, receive, send)
            return
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        context = contextvars.copy_context()
        work = self._threads.submit(context.run, self._serve, scope, body_file)
        # Closed once the thread is done with it, however this task ends meanwhile.
        work.add_done_callback(lambda _: body_file.close())
        answer = asyncio.wrap_future(work)
        done, _ = await asyncio.wait({answer}, timeout=settings.API_QUEUE_TIMEOUT)
        if not done and work.cancel():  # still queued: no thread came free in time
            response = self._busy(scope)
        else:
            response = await answer
        # As Django's handler: a client gone meanwhile leaves nothing to do (the response is closed).
        with contextlib.suppress(asyncio.CancelledError):
            await self.send_response(response, send)

    def _busy(self, scope: dict[str, Any]) -> HttpResponseBase:
        """503 with ``Retry-After`` (the API's transient-error answer, in the caller's language)
        for a request that waited ``API_QUEUE_TIMEOUT`` for a thread: every API thread is held,
        e.g. by requests waiting on a lock. Made here, on the event loop, touching no database."""
        # Imported here: console.asgi imports this module before Django's apps are loaded.
        from console.api.exceptions import log_unavailable, unavailable_response

        request, _ = self.create_request(scope, io.BytesIO())  # its headers only
        language = get_language_from_request(request) if request else settings.LANGUAGE_CODE
        with translation.override(language):
            response = unavailable_response()
        response["Cache-Control"] = "no-store"
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Language"] = language
        log_unavailable(scope["method"], scope["path"], TimeoutError("no API thread came free"))
        return response

    def _serve(self, scope: dict[str, Any], body_file: Any) -> HttpResponseBase:
        """On an API thread: the whole request, as Django's handlers run it, response closed."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self._sync.get_response(request)
            response._handler_class = self.__class__  # type: ignore[attr-defined]
        assert response is not None
        if response.streaming:  # no API view streams; were one to, its body is read here
            streamed = response
            response = HttpResponse(b"".join(streamed), status=streamed.status_code)
            for header, value in streamed.items():
                response[header] = value
            response.cookies = streamed.cookies
            streamed.close()
        # Closing sends request_finished here, on the thread that used the database: its
        # connection goes back to the pool before the bytes go out.
        response.close()
        return response
