"""Django's ASGI handler, with an API request's middleware and view run in one thread hop (issue 22).

Under ASGI, Django runs the middleware chain in async mode and adapts each piece that is not: the
chain enters a thread (the console's sync-only middleware), comes back to the event loop for the
async-capable ones below it, where Django's ``MiddlewareMixin`` sends each ``process_request`` and
``process_response`` to a thread again, then the CSRF check and the view go to a thread once more:
about ten hops per request, 1-2 ms of CPU, for views that are all synchronous. The API's views
(``/api/``: DRF, every one synchronous) are served instead by the same middleware, loaded in
synchronous mode, and the view, all in one hop to the request's thread: the same code in the same
order, the database connection of the same thread. Every other path (pages, the port proxy's
asynchronous views, static files) keeps Django's own handling.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.http import HttpRequest, HttpResponseBase

API_PREFIX = "/api/"


class ConsoleASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        self._sync = BaseHandler()
        self._sync.load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        if request.path_info.startswith(API_PREFIX):
            # thread_sensitive: the request's own thread (ASGIHandler gives each request one),
            # where the started signal ran and the response will be closed.
            return await sync_to_async(self._sync.get_response, thread_sensitive=True)(request)
        return await super().get_response_async(request)
