"""WSGI entry point (the API measured under a WSGI server beside the ASGI one: bench/load.py
--wsgi; production serves everything through console.asgi)."""

from __future__ import annotations

import gc
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
application = get_wsgi_application()

# As console/asgi.py: what start-up made lives as long as the process, kept out of the
# collector's full passes.
gc.freeze()
