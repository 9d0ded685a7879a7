"""ASGI entry point: HTTP through Django, websockets through Channels with auth and origin checks."""

from __future__ import annotations

import gc
import os

import django

from console.api.handler import ConsoleASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django.setup(set_prefix=False)  # as get_asgi_application() does, with the console's handler
django_asgi_app = ConsoleASGIHandler()  # the API's requests in one thread hop

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs the app registry)
from channels.routing import ProtocolTypeRouter  # noqa: E402

from console.bodylimit import RequestBodyLimit  # noqa: E402
from console.embedded import start_embedded_worker  # noqa: E402
from console.routing import OriginValidator, websocket_router  # noqa: E402
from slices.port_views import AppHostRouter  # noqa: E402

# An app host of subdomain mode (APPS_DOMAIN) is routed to the port proxy (issue 19).
application = AppHostRouter(
    ProtocolTypeRouter(
        {
            # Bodies capped by route before Django reads a byte (issue 29).
            "http": RequestBodyLimit(django_asgi_app),
            "websocket": OriginValidator(AuthMiddlewareStack(websocket_router())),
        }
    )
)

# Embedded default only: the background worker lives in this process.
start_embedded_worker()

# What start-up made (modules, settings, URL patterns, templates) lives as long as the process:
# kept out of the collector's full passes, which under load otherwise walk it all again and
# pause every request and websocket of the process meanwhile.
gc.freeze()
