from __future__ import annotations

import csv
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, cast

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from billing import clock, lowbalance, offers, services, statements
from billing.choices import NoticeKind, PaymentState
from billing.forms import QuoteForm, StatementMonthForm, TopUpForm
from billing.models import Account, BillingNotice, UsageSession, Wallet
from billing.providers import get_provider
from billing.providers.sandbox import SandboxProvider, sandbox_enabled
from console.htmx import render_page
from console.tenancy import acting, team_of
from console.verification.services import VerificationRequired
from console.verification.views import refusal_response

if TYPE_CHECKING:
    from console.models import User

    class AuthenticatedRequest(HttpRequest):
        """What ``@login_required`` views receive: ``user`` is never anonymous."""

        user: User


PAGE_SIZE = 20


def _wallet(user: User) -> Wallet | None:
    return Wallet.objects.filter(team=team_of(user)).first()


def _transactions_page(request: AuthenticatedRequest, wallet: Wallet | None) -> Any:
    page = Paginator(statements.transactions_for(acting(request)), PAGE_SIZE).get_page(
        request.GET.get("tx_page")
    )
    statements.with_net_amounts(list(page.object_list), wallet.pk if wallet else None)
    return page


def _usage_page(request: AuthenticatedRequest) -> Any:
    sessions = UsageSession.objects.for_team(acting(request)).order_by("-started_at", "-id")
    page = Paginator(sessions, PAGE_SIZE).get_page(request.GET.get("usage_page"))
    statements.with_usage_shapes(list(page.object_list))
    return page


@login_required
@require_GET
def overview(request: AuthenticatedRequest) -> HttpResponse:
    wallet = _wallet(acting(request))
    now = clock.now()
    summary = services.get_wallet_summary(acting(request))
    runway = summary.runway_seconds
    context = {
        "summary": summary,
        "vouchers": Account.objects.filter(wallet__team=team_of(acting(request)), kind="voucher")
        .spendable(now)
        .order_by("expires_at"),
        # A low-balance warning shows only while it still holds (something burns, the runway is
        # within its threshold); stops stay, as what happened.
        "notices": [
            n
            for n in BillingNotice.objects.filter(wallet__team=team_of(acting(request)))[:3]
            if n.kind != NoticeKind.LOW_BALANCE
            or lowbalance.warning_holds(n.threshold_seconds, runway)
        ],
        "transactions": _transactions_page(request, wallet),
        "usage": _usage_page(request),
        "topup_form": TopUpForm(),
        "price_list": services.price_list(now),
        "bonus_rule": services.current_bonus_rule(),
        "window": services.settlement_window(),
    }
    partial = {"tx_page": "transactions", "usage_page": "usage"}
    which = next((v for k, v in partial.items() if k in request.GET), "balances")
    return render_page(request, "billing/overview.html", context, which)


@login_required
@require_POST
def topup(request: AuthenticatedRequest) -> HttpResponse:
    form = TopUpForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Enter an amount between 1 and 10,000,000 元."))
        return redirect("billing:overview")
    try:
        payment, _created = services.start_topup(
            acting(request), form.cleaned_data["amount"], request=request
        )
    except VerificationRequired as exc:
        return refusal_response(request, exc)
    except services.BillingError as exc:
        messages.error(request, exc.message())
        return redirect("billing:overview")
    return redirect(get_provider(payment.provider).checkout_url(payment))


def _sandbox_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """404 while ``BILLING_SANDBOX_PAYMENTS`` is off (checked per request, not at import)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not sandbox_enabled():
            raise Http404("sandbox payments are disabled")
        return view(request, *args, **kwargs)

    return wrapper


@_sandbox_only
@login_required
@require_http_methods(["GET", "POST"])
def sandbox_checkout(request: AuthenticatedRequest, public_id: str) -> HttpResponse:
    """The sandbox provider's checkout page; "Pay" makes the sandbox send its signed callback."""
    payment = services.get_payment_for_user(acting(request), public_id)
    if request.method == "POST" and payment.state == PaymentState.PENDING:
        provider = cast(SandboxProvider, get_provider("sandbox"))
        status = "failed" if request.POST.get("outcome") == "fail" else "succeeded"
        body, headers = provider.build_callback(payment, status)
        # The same verification path as an HTTP callback from outside (billing:sandbox-webhook).
        services.handle_webhook("sandbox", body, headers)
        payment.refresh_from_db()
        if payment.state == PaymentState.SUCCEEDED:
            messages.success(
                request, _("Payment received: %(amount)s 元.") % {"amount": payment.amount}
            )
        else:
            messages.warning(request, _("The payment was not completed."))
        return redirect("billing:overview")
    return render(request, "billing/sandbox_checkout.html", {"payment": payment})


@csrf_exempt  # called by the provider, authenticated by its HMAC signature instead
@_sandbox_only
@require_POST
def sandbox_webhook(request: HttpRequest) -> HttpResponse:
    try:
        credited = services.handle_webhook("sandbox", request.body, dict(request.headers))
    except services.BillingError as exc:
        return JsonResponse(exc.as_body(), status=exc.http_status)
    return JsonResponse({"ok": True, "credited": credited})


def _statement(request: AuthenticatedRequest) -> statements.Statement | None:
    form = StatementMonthForm(request.GET)
    if not form.is_valid():
        return None
    return statements.build_statement(
        _wallet(acting(request)), form.cleaned_data.get("month") or None, clock.now()
    )


@login_required
@require_GET
def statement(request: AuthenticatedRequest) -> HttpResponse:
    result = _statement(request)
    if result is None:
        return HttpResponseBadRequest(_("Use ?month=YYYY-MM."))
    return render(request, "billing/statement.html", {"statement": result})


@login_required
@require_GET
def statement_csv(request: AuthenticatedRequest) -> HttpResponse:
    result = _statement(request)
    if result is None:
        return HttpResponseBadRequest(_("Use ?month=YYYY-MM."))
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="statement-{result.month:%Y-%m}.csv"'
    response.write("\ufeff")  # Excel opens UTF-8 with a BOM
    out = csv.writer(response)
    out.writerow(
        [
            "time",
            "transaction",
            "kind",
            "description",
            "cash",
            "trial",
            "voucher",
            "amount",
            "balance",
        ]
    )
    out.writerow(["", "", "opening", "", "", "", "", "", result.opening])
    for line in result.lines:
        out.writerow(
            [
                statements.local_iso(line.txn.created_at),
                line.txn.public_id,
                line.txn.kind,
                _csv_text(line.txn.description),
                line.by_kind.get("cash", ""),
                line.by_kind.get("trial", ""),
                line.by_kind.get("voucher", ""),
                line.amount,
                line.balance_after,
            ]
        )
    out.writerow(["", "", "closing", "", "", "", "", "", result.closing])
    return response


@login_required
@require_GET
def usage_csv(request: AuthenticatedRequest) -> HttpResponse:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="usage.csv"'
    response.write("\ufeff")
    out = csv.writer(response)
    out.writerow(
        [
            "session",
            "resource_kind",
            "resource",
            "name",
            "gpu_model",
            "cards",
            "rate",
            "started",
            "ended",
            "seconds",
            "amount",
            "state",
            "price_version",
            "member",  # issue 30: who in the team caused it (empty: the team's shared storage)
        ]
    )
    sessions = (
        UsageSession.objects.for_team(acting(request))
        .select_related("price_book", "member")
        .order_by("started_at", "id")
    )
    for s in sessions.iterator(chunk_size=2000):
        out.writerow(
            [
                s.public_id,
                s.resource_kind,
                s.resource_id,
                _csv_text(s.label),
                s.gpu_model,
                s.cards,
                s.rate,
                statements.local_iso(s.started_at),
                statements.local_iso(s.ended_at),
                s.settled_seconds,
                s.charged,
                s.state,
                s.price_book.version if s.price_book else "",
                _csv_text(s.member.get_username()) if s.member else "",
            ]
        )
    return response


def _csv_text(value: str) -> str:
    """Neutralise spreadsheet formulas in user-provided text (CSV injection)."""
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


@require_GET
def prices(request: HttpRequest) -> HttpResponse:
    """The public price page: every GPU model, on-demand and locked-price terms, what is free."""
    return render(request, "billing/prices.html", {"sheet": offers.price_sheet()})


@require_GET
def quote(request: HttpRequest) -> HttpResponse:
    """The price calculator; public, and with the runway of the balance for a signed-in user."""
    sheet = offers.price_sheet()
    form = QuoteForm(request.GET or None)
    result = None
    error = ""
    if form.is_valid():
        gpu_model = form.cleaned_data["gpu_model"]
        if gpu_model not in sheet.orderable_models:
            # A placeholder price is the operator's, not an offer: nothing to quote or order.
            error = _("%(model)s is not yet available.") % {"model": gpu_model}
        else:
            try:
                result = services.quote_for(
                    acting(request),
                    gpu_model,
                    form.cleaned_data["cards"],
                    form.cleaned_data["disk_gb"],
                )
            except services.BillingError as exc:
                error = exc.message()
    context = {"form": form, "quote": result, "error": error, "sheet": sheet}
    return render_page(request, "billing/quote.html", context, "result")
