"""The reservations page (预约, issue 32): book a window at a locked price, see the capacity
calendar, list and cancel the team's windows. Thin: ``slices.services.reservations`` decides."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_http_methods, require_POST

from billing.pricing import RESERVATION_FULL_REFUND_SECONDS, RESERVATION_LATE_REFUND_SHARE
from console.errors import DomainError
from console.htmx import render_page
from console.tenancy import acting
from slices import topology
from slices.models import Cluster, Reservation
from slices.services import reservations


class BookingForm(forms.Form):
    gpu_model = forms.ChoiceField(label=gettext_lazy("GPU model"))
    region = forms.ChoiceField(label=gettext_lazy("Region"))
    cards = forms.IntegerField(label=gettext_lazy("Cards"), min_value=1, initial=8)
    starts_at = forms.DateTimeField(
        label=gettext_lazy("Start"),
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S"],
    )
    hours = forms.IntegerField(
        label=gettext_lazy("Hours"), min_value=1, max_value=reservations.MAX_HOURS, initial=24
    )
    image = forms.CharField(label=gettext_lazy("Image"), required=False, max_length=120)
    name = forms.CharField(label=gettext_lazy("Name"), required=False, max_length=63)

    def __init__(self, *args: Any, choices: dict[str, list[tuple[str, str]]], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.fields["gpu_model"].choices = choices["models"]
        self.fields["region"].choices = choices["regions"]

    def booking(self) -> reservations.BookingRequest:
        return reservations.BookingRequest(**self.cleaned_data)


def _choices() -> dict[str, list[tuple[str, str]]]:
    clusters = Cluster.objects.select_related("region", "gpu_model").order_by("position")
    models = list(dict.fromkeys((c.gpu_model.code, c.gpu_model.code) for c in clusters))
    regions = list(dict.fromkeys((c.region.code, c.region.display_name) for c in clusters))
    return {"models": models, "regions": regions}


def _default_start() -> datetime:
    start = timezone.localtime() + timedelta(days=2)
    return start.replace(minute=0, second=0, microsecond=0)


def _calendar(model: str, region: str, cards: int) -> list[dict[str, Any]]:
    """The capacity calendar as cells: the day, how free it is, whether ``cards`` fit."""
    try:
        days = reservations.capacity_calendar(model, region)
    except DomainError:
        return []
    cells = []
    for d in days:
        fits = (
            (d.largest_host >= cards)
            if cards in topology.HOST_SIZES
            else (d.largest_slice >= cards)
        )
        level = 0 if not d.total_gpus else min(4, int(d.share * 4 + 0.999))
        cells.append({"day": d, "fits": fits, "level": level})
    return cells


@login_required
@require_http_methods(["GET", "POST"])
def reservation_list(request: HttpRequest) -> HttpResponse:
    """Book a window (the price answered as the form changes), the calendar, the team's windows."""
    who = acting(request)
    choices = _choices()
    initial = {
        "gpu_model": choices["models"][0][0] if choices["models"] else "",
        "region": choices["regions"][0][0] if choices["regions"] else "",
        "cards": 8,
        "hours": 24,
        "starts_at": _default_start().strftime("%Y-%m-%dT%H:%M"),
    }
    data = request.POST if request.method == "POST" else (request.GET or None)
    form = BookingForm(data, choices=choices, initial=initial)
    quote, quote_error, status = None, "", 200
    if form.is_bound and form.is_valid():
        if request.method == "POST":
            try:
                row, _created = reservations.book_reservation(who, form.booking(), request=request)
            except DomainError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, exc.message())
                status = exc.http_status
            else:
                messages.success(
                    request,
                    _("Booked %(name)s: %(total)s 元 paid.")
                    % {"name": row.name, "total": row.total},
                )
                return redirect("slices:reservation-list")
        else:
            try:
                quote = reservations.quote_window(form.booking())
            except DomainError as exc:
                quote_error = exc.message()
    elif form.is_bound and request.method == "POST":
        status = 400  # a live quote (htmx GET) answers 200: htmx swaps no 4xx, the errors show
    chosen = form.data if form.is_bound else initial
    try:
        cards = int(chosen.get("cards") or 8)
    except (TypeError, ValueError):
        cards = 8
    context = {
        "form": form,
        "quote": quote,
        "quote_error": quote_error,
        "calendar": _calendar(
            str(chosen.get("gpu_model", "")), str(chosen.get("region", "")), cards
        ),
        "cards": cards,
        "rows": Reservation.objects.for_team(who)
        .select_related("gpu_model", "region", "instance")
        .order_by("-starts_at")[:100],
        "full_refund_hours": RESERVATION_FULL_REFUND_SECONDS // 3600,
        "late_percent": int(RESERVATION_LATE_REFUND_SHARE * 100),
    }
    return render_page(request, "slices/reservation_list.html", context, "booking", status=status)


@login_required
@require_POST
def reservation_cancel(request: HttpRequest, public_id: str) -> HttpResponse:
    row, refunded = reservations.cancel_reservation(acting(request), public_id, request=request)
    messages.success(
        request,
        _("Cancelled %(name)s; %(amount)s 元 refunded.") % {"name": row.name, "amount": refunded},
    )
    return redirect("slices:reservation-list")
