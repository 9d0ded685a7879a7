"""Small htmx helpers shared by every app's views (one view, one template, inline partials)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

# htmx stops an `hx-trigger="every Ns"` poll when the server answers 286.
STOP_POLLING = 286


def render_page(
    request: HttpRequest, template: str, context: dict[str, Any], partial: str, status: int = 200
) -> HttpResponse:
    """Render the whole page, or only ``template#partial`` when htmx asks for that region.

    Boosted navigations and history restores want the whole page, so only non-boosted htmx requests
    get the partial.
    """
    htmx = getattr(request, "htmx", None)
    if htmx and not htmx.boosted and not htmx.history_restore_request:
        return render(request, f"{template}#{partial}", context, status=status)
    return render(request, template, context, status=status)


def stop_polling(response: HttpResponse) -> HttpResponse:
    """Mark a polled fragment as final: the state settled, htmx stops asking."""
    response.status_code = STOP_POLLING
    return response
