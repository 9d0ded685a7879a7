"""The verification page (/account/verification/), the operators' review queue
(/ops/verifications/) and the licence download (owner or operator)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.http import FileResponse, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.auth import staff_required
from console.errors import DomainError
from console.verification import services
from console.verification.forms import DecisionForm, OrganisationForm, PersonalForm
from console.verification.providers import get_provider


def _page(request: HttpRequest, status: int = 200, **forms: Any) -> HttpResponse:
    context = {
        "status": services.status(request.user),  # type: ignore[arg-type]
        "provider": get_provider(),
        "personal_form": forms.get("personal_form") or PersonalForm(),
        "organisation_form": forms.get("organisation_form") or OrganisationForm(),
        "active": forms.get("active", "personal"),
    }
    return render(request, "console/verification.html", context, status=status)


def _refused(form: Any, exc: DomainError) -> None:
    field = exc.field if exc.field in form.fields else None
    form.add_error(field, exc.message())


@login_required
@require_http_methods(["GET", "POST"])
def verification(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _page(request)
    kind = request.POST.get("kind", "personal")
    form: Any
    try:
        if kind == "personal":
            form = PersonalForm(request.POST)
            if not form.is_valid():
                return _page(request, 400, personal_form=form)
            row = services.submit_personal(request.user, **form.cleaned_data)  # type: ignore[arg-type]
        else:
            form = OrganisationForm(request.POST, request.FILES)
            if not form.is_valid():
                return _page(request, 400, organisation_form=form, active="organisation")
            row = services.submit_organisation(request.user, **form.cleaned_data)  # type: ignore[arg-type]
    except DomainError as exc:
        _refused(form, exc)
        active = "personal" if kind == "personal" else "organisation"
        return _page(request, exc.http_status, **{f"{active}_form": form, "active": active})
    if row.state == "approved":
        messages.success(request, _("Your account is verified."))
    elif row.state == "pending":
        messages.info(request, _("Submitted: an operator reviews it within 2 working days."))
    else:
        messages.error(
            request, _("The verification was rejected: %(reason)s") % {"reason": _(row.reason)}
        )
    return redirect("account-verification")


@login_required
@require_GET
def licence(request: HttpRequest, public_id: str) -> FileResponse:
    row = services.licence_file(request.user, public_id)  # type: ignore[arg-type]
    response = FileResponse(row.licence.open("rb"), content_type=row.licence_content_type)
    response["Content-Disposition"] = "inline"
    response["Cache-Control"] = "private, no-store"
    return response


@staff_required
@require_GET
def review_queue(request: HttpRequest) -> HttpResponse:
    return render(request, "console/ops_verifications.html", {"queue": services.review_queue()})


@staff_required
@permission_required("console.change_verification", raise_exception=True)
@require_POST
def review_decide(request: HttpRequest, public_id: str) -> HttpResponse:
    form = DecisionForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Choose approve or reject."))
        return redirect("ops-verifications")
    try:
        row = services.decide(
            public_id,
            approve=form.cleaned_data["decision"] == "approve",
            by=request.user,  # type: ignore[arg-type]
            reason=form.cleaned_data["reason"],
        )
    except DomainError as exc:
        messages.error(request, exc.message())
        return redirect("ops-verifications")
    messages.success(
        request,
        _("%(name)s: %(state)s.") % {"name": row.display_name, "state": row.get_state_display()},
    )
    return redirect("ops-verifications")


def refusal_response(request: HttpRequest, exc: DomainError) -> HttpResponse:
    """What a page answers when the gate refuses (403 ``verification_required``), so every form
    door refuses like the API does."""
    return render(
        request,
        "console/verification_required.html",
        {"message": exc.message(), "error": exc},
        status=exc.http_status,
    )
