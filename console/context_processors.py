from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def console(request: HttpRequest) -> dict[str, object]:
    return {
        "CONSOLE_EMBEDDED": settings.EMBEDDED,
        "CONSOLE_MODE_LABEL": settings.CONSOLE_MODE_LABEL,
        "CONSOLE_VERSION": settings.CONSOLE_VERSION,
        "SUPPORT_EMAIL": settings.SUPPORT_EMAIL,
    }
