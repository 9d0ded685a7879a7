"""Invoice pages: the customer's /billing/invoices/ (request, list, download) and the operators'
/ops/invoices/ (issue, reject, red-letter reversal)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from billing.invoicing import services
from billing.invoicing.api import pdf_response
from billing.invoicing.forms import InvoiceRequestForm, OperatorActionForm
from billing.invoicing.models import InvoiceState
from console.auth import staff_required
from console.errors import DomainError
from console.tenancy import acting
from console.verification.services import VerificationRequired, status
from console.verification.views import refusal_response


def _page(request: HttpRequest, form: InvoiceRequestForm, code: int = 200) -> HttpResponse:
    user: Any = acting(request)
    context = {
        "form": form,
        "balance": services.balance_for(user),
        "minimum": services.minimum_amount(),
        "invoices": services.invoices_for(user)[:100],
        "verification": status(user),
    }
    return render(request, "billing/invoices.html", context, status=code)


@login_required
@require_http_methods(["GET", "POST"])
def invoices(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _page(request, InvoiceRequestForm())
    form = InvoiceRequestForm(request.POST)
    if not form.is_valid():
        return _page(request, form, 400)
    try:
        row = services.request_invoice(acting(request), **form.cleaned_data, request=request)
    except VerificationRequired as exc:
        return refusal_response(request, exc)
    except DomainError as exc:
        form.add_error(exc.field if exc.field in form.fields else None, exc.message())
        return _page(request, form, exc.http_status)
    messages.success(
        request,
        _("Invoice of %(amount)s 元 requested: it is issued within 2 working days.")
        % {"amount": row.amount},
    )
    return redirect("billing:invoices")


@login_required
@require_GET
def invoice_pdf(request: HttpRequest, public_id: str) -> FileResponse:
    row = services.get_invoice_for_user(acting(request), public_id)
    if not row.pdf:
        raise Http404
    return pdf_response(row.pdf, f"invoice-{row.number}.pdf")


@login_required
@require_GET
def invoice_red_pdf(request: HttpRequest, public_id: str) -> FileResponse:
    row = services.get_invoice_for_user(acting(request), public_id)
    if not row.red_pdf:
        raise Http404
    return pdf_response(row.red_pdf, f"invoice-{row.red_number}.pdf")


@staff_required
@require_GET
def ops_invoices(request: HttpRequest) -> HttpResponse:
    rows = services.queue()
    context = {
        "requested": rows.filter(state=InvoiceState.REQUESTED),
        "issued": rows.filter(state=InvoiceState.ISSUED).order_by("-decided_at")[:100],
    }
    return render(request, "billing/ops_invoices.html", context)


@staff_required
@permission_required("billing.change_invoice", raise_exception=True)
@require_POST
def ops_invoice_action(request: HttpRequest, public_id: str, verb: str) -> HttpResponse:
    form = OperatorActionForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    by: Any = request.user
    try:
        if verb == "issue":
            row = services.issue_invoice(public_id, by=by, request=request)
            messages.success(request, _("Invoice %(number)s issued.") % {"number": row.number})
        elif verb == "reject":
            services.reject_request(public_id, by=by, reason=reason, request=request)
            messages.success(request, _("Request rejected."))
        elif verb == "reverse":
            row = services.reverse_invoice(public_id, by=by, reason=reason, request=request)
            messages.success(
                request,
                _("Invoice %(number)s reversed by red-letter invoice %(red)s.")
                % {"number": row.number, "red": row.red_number},
            )
        else:
            raise Http404
    except DomainError as exc:
        messages.error(request, exc.message())
    return redirect("billing:ops-invoices")


@staff_required
@require_GET
def ops_invoice_pdf(request: HttpRequest, public_id: str) -> Any:  # a FileResponse
    row = services.get_invoice(public_id)
    field = row.red_pdf if request.GET.get("red") else row.pdf
    if not field:
        raise Http404
    return pdf_response(field, f"invoice-{row.public_id}.pdf")
