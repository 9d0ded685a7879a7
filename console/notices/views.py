"""/notifications/: the inbox (htmx list, mark read), the unread badge, the preferences."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.errors import DomainError
from console.htmx import render_page
from console.notices import services
from console.notices.events import EVENTS, PREFERENCE_EVENTS


def _context(request: HttpRequest) -> dict[str, Any]:
    user: Any = request.user
    page = Paginator(services.notices_for(user), 20).get_page(request.GET.get("page"))
    for notice in page.object_list:
        notice.text = services.render(notice)  # the page's language
    pref = services.preference(user)
    rows = [
        (event, EVENTS[event].label, services.channels_for(pref, event))
        for event in PREFERENCE_EVENTS
    ]
    return {
        "page": page,
        "unread": services.unread_count(user),
        "pref": pref,
        "pref_rows": rows,
        "language_choices": settings.LANGUAGES,
    }


@login_required
@require_http_methods(["GET", "POST"])
def inbox(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":  # the preferences form
        channels = {
            event: [c for c in ("mail", "sms") if request.POST.get(f"{event}-{c}")]
            for event in PREFERENCE_EVENTS
        }
        try:
            services.save_preference(
                request.user,  # type: ignore[arg-type]
                language=request.POST.get("language", ""),
                phone=request.POST.get("phone", ""),
                channels=channels,
                low_balance_yuan=request.POST.get("low_balance_yuan", ""),
            )
        except DomainError as exc:
            messages.error(request, exc.message())
            return redirect("notifications")
        messages.success(request, _("Notification settings saved."))
        return redirect("notifications")
    return render_page(request, "console/notifications.html", _context(request), "inbox")


@login_required
@require_POST
def read(request: HttpRequest, public_id: str) -> HttpResponse:
    services.mark_read(request.user, public_id)
    if request.headers.get("HX-Request"):
        return render_page(request, "console/notifications.html", _context(request), "inbox")
    return redirect("notifications")


@login_required
@require_POST
def read_all(request: HttpRequest) -> HttpResponse:
    services.mark_all_read(request.user)
    if request.headers.get("HX-Request"):
        return render_page(request, "console/notifications.html", _context(request), "inbox")
    return redirect("notifications")


@require_GET
def badge(request: HttpRequest) -> HttpResponse:
    """The header's unread count (loaded by htmx after the page, so pages keep their queries)."""
    count = services.unread_count(request.user)
    text = str(count) if count else ""
    label = _("%(n)d unread notifications") % {"n": count}
    return HttpResponse(
        f'<span class="badge rounded-pill text-bg-danger" id="notice-count" aria-label="{label}">'
        f"{text}</span>"
        if count
        else '<span id="notice-count"></span>'
    )
