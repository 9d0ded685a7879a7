"""对公转账 pages: the customer starts one (/billing/transfers/, POST) and reads where to pay
(/billing/transfers/<id>/); operators match transfers (/ops/transfers/) by hand or from a bank
statement CSV."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from billing import services as billing
from billing.forms import TopUpForm
from billing.transfers import services
from console.auth import staff_required
from console.errors import DomainError
from console.tenancy import acting
from console.verification.services import VerificationRequired
from console.verification.views import refusal_response


@login_required
@require_POST
def start(request: HttpRequest) -> HttpResponse:
    form = TopUpForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Enter an amount between 1 and 10,000,000 元."))
        return redirect("billing:overview")
    try:
        payment, _created = billing.start_topup(
            acting(request),
            form.cleaned_data["amount"],
            provider="bank_transfer",
            request=request,
        )
    except VerificationRequired as exc:
        return refusal_response(request, exc)
    except DomainError as exc:
        messages.error(request, exc.message())
        return redirect("billing:overview")
    return redirect("billing:transfer-detail", public_id=payment.public_id)


@login_required
@require_GET
def detail(request: HttpRequest, public_id: str) -> HttpResponse:
    row = services.transfer_for_user(acting(request), public_id)
    context = {
        "transfer": row,
        "payment": row.payment,
        "account_name": settings.BANK_TRANSFER_ACCOUNT_NAME,
        "bank": settings.BANK_TRANSFER_BANK,
        "account_number": settings.BANK_TRANSFER_ACCOUNT_NUMBER,
    }
    return render(request, "billing/transfer.html", context)


@staff_required
@permission_required("billing.change_banktransfer", raise_exception=True)
@require_http_methods(["GET", "POST"])
def ops_transfers(request: HttpRequest) -> HttpResponse:
    results: list[Any] = []
    by: Any = request.user
    if request.method == "POST":
        try:
            upload = request.FILES.get("statement")
            if upload is not None and not isinstance(upload, list):
                results = services.import_statement(upload.read(), by=by)
                credited = sum(1 for r in results if r.outcome == "credited")
                messages.success(
                    request, _("Statement read: %(n)d transfer(s) credited.") % {"n": credited}
                )
            else:
                credited_now = services.match(
                    request.POST.get("code", ""),
                    bank_reference=request.POST.get("bank_reference", ""),
                    amount=request.POST.get("amount", ""),
                    by=by,
                )
                if credited_now:
                    messages.success(request, _("Transfer credited."))
                else:
                    messages.info(request, _("This transfer was already credited."))
        except DomainError as exc:
            messages.error(request, exc.message())
        if not results:
            return redirect("billing:ops-transfers")
    return render(
        request, "billing/ops_transfers.html", {"pending": services.pending(), "results": results}
    )
