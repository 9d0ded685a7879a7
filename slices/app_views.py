"""AI applications' pages (issue 20), thin: the catalogue's apps (``/apps/``), an app's page with
its launch form (``/apps/<slug>/``), and its API through the console with the app's key
(``/apps/<instance>/v1/...``). The offer, the order and the key check are in
``slices.services.apps``; the relay is the port proxy's (``slices.port_views``)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from billing import services as billing
from console.errors import DomainError
from console.ids import parse_uuid
from console.tenancy import acting
from marketplace import aiapps
from slices.models import Instance
from slices.port_views import _response, headers_for_api, relay
from slices.services import NoCapacity
from slices.services import apps as app_service


@require_http_methods(["GET"])
def app_list(request: HttpRequest) -> HttpResponse:
    """The apps of the catalogue, each priced on the recommended GPU (public, like prices)."""
    language = request.LANGUAGE_CODE
    # One look at the price book and the wallet for every app; no capacity look-up (the app's
    # page says what is free now).
    rates = app_service.price_rates()
    summary = billing.get_wallet_summary(acting(request))
    balance = summary.spendable
    trial = app_service.trial_left(acting(request), summary)
    rows = []
    for app in aiapps.shipped_apps():
        offer = app_service.app_offer(
            acting(request), app, rates=rates, balance=balance, trial=trial, full=False
        )
        rows.append(
            {
                "app": app,
                "name": app.localized_name(language),
                "summary": app.localized_summary(language),
                "offer": offer,
            }
        )
    return render(request, "slices/app_list.html", {"rows": rows})


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


@require_http_methods(["GET", "POST"])
def app_detail(request: HttpRequest, slug: str) -> HttpResponse:
    """The app: what it runs, on what, for how much, the licence to accept, and one button."""
    app = aiapps.get_app(slug)
    if app is None:
        raise Http404
    data = request.POST if request.method == "POST" else request.GET
    gpu_model = data.get("gpu_model") or None
    cards = _int(data.get("cards"))
    if cards is None and data.get("cards"):
        cards = 0  # not a number: the offer says what is allowed
    model = data.get("model") or None
    error: Any = None
    if request.method == "POST":
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        key = parse_uuid(request.POST.get("launch_key", ""))
        try:
            instance = app_service.launch_app(
                acting(request),
                app,
                gpu_model=gpu_model,
                cards=cards,
                model=model,
                accept_license=request.POST.get("accept_license") == "on",
                # One launch per rendering of the page: a double click launches once.
                idempotency_key=f"app:{key}" if key else None,
                request=request,
            )
        except (DomainError, NoCapacity) as exc:
            error = exc
        else:
            messages.success(
                request,
                _("%(app)s is starting: it opens here when it answers.")
                % {"app": app.localized_name(request.LANGUAGE_CODE)},
            )
            return redirect("slices:instance-detail", public_id=instance.public_id)
    offer = app_service.app_offer(
        acting(request), app, gpu_model=gpu_model, cards=cards, model=model
    )
    runs: list[Instance] = []
    if request.user.is_authenticated:
        runs = list(
            Instance.objects.for_team(acting(request))
            .filter(app=app.slug)
            .select_related("gpu_model")
            .order_by("-created_at")[:5]
        )
    language = request.LANGUAGE_CODE
    context = {
        "app": app,
        "offer": offer,
        "error": error,
        "runs": runs,
        "app_name": app.localized_name(language),
        "app_summary": app.localized_summary(language),
        "ports": [(p.port, p.localized_name(language)) for p in app.ports],
        "card_counts": {
            c.option.gpu_model: [
                n for n in (1, 2, 4, 8) if c.option.min_cards <= n <= c.option.max_cards
            ]
            for c in offer.choices
        },
        "launch_key": uuid.uuid4(),
    }
    return render(request, "slices/app_detail.html", context, status=409 if error else 200)


# ---------------------------------------------------------------------------------------------
# The app's API with its key: /apps/<instance>/v1/...
# ---------------------------------------------------------------------------------------------


def _openai_error(status: int, message: str, code: str) -> HttpResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    response = HttpResponse(json.dumps(body), status=status, content_type="application/json")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="app"'
    return response


def _bearer(request: HttpRequest) -> str:
    scheme, _sep, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


@csrf_exempt
async def app_api_proxy(request: HttpRequest, public_id: Any, rest: str = "") -> HttpResponseBase:
    """The app's API through the console: the key is the app's, checked before the node sees
    anything; no console session is used (a program holds the key, not a browser), so neither
    CSRF nor the session cookie applies."""
    try:
        access = await sync_to_async(app_service.resolve_api_access)(public_id, _bearer(request))
    except app_service.ApiKeyRefused:
        return _openai_error(
            401,
            "Incorrect or missing API key for this app (Authorization: Bearer <key>).",
            "invalid_api_key",
        )
    upstream = await relay(request, access, headers_for_api(request))
    if upstream is None:
        return _openai_error(503, "The app is not answering yet.", "app_unavailable")
    return _response(upstream, access, request, on_console=True)
