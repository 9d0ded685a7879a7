"""Account pages: overview, SSH keys, API tokens (htmx partials with plain-form fallbacks)."""

from __future__ import annotations

from allauth.account.internal.flows.email_verification import (
    consume_email_verification_rate_limit,
)
from allauth.account.models import EmailAddress
from allauth.core.internal import ratelimit
from allauth.core.ratelimit import respond_429
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from billing.services import get_wallet_summary
from console import services
from console.forms import ApiTokenForm, ResendVerificationForm, SshKeyForm
from console.htmx import render_page
from console.models import ApiToken, SshKey


def _add_errors(form: SshKeyForm | ApiTokenForm, exc: ValidationError) -> None:
    if hasattr(exc, "error_dict"):
        for field, errors in exc.error_dict.items():
            form.add_error(field if field in form.fields else None, errors)
    else:
        form.add_error(None, exc)


@login_required
@require_GET
def overview(request: HttpRequest) -> HttpResponse:
    context = {
        "emails": EmailAddress.objects.filter(user=request.user).order_by("-primary", "email"),
        "ssh_key_count": SshKey.objects.for_owner(request.user).count(),
        "token_count": ApiToken.objects.for_owner(request.user).active().count(),
        "wallet": get_wallet_summary(request.user),
    }
    return render(request, "console/account.html", context)


# --- SSH keys -----------------------------------------------------------------------------------
def _ssh_keys_page(
    request: HttpRequest, form: SshKeyForm, *, notice: str = "", partial: str | None = None
) -> HttpResponse:
    context = {"keys": SshKey.objects.for_owner(request.user), "form": form, "notice": notice}
    if partial:
        return render_page(request, "console/account_ssh_keys.html", context, partial)
    return render(request, "console/account_ssh_keys.html", context)


def _done(request: HttpRequest, notice: str, page: str) -> HttpResponse:
    """After a change: the refreshed panel for htmx, a redirect with a message otherwise."""
    if request.htmx:
        if page == "account:ssh-key-list":
            return _ssh_keys_page(request, SshKeyForm(), notice=notice, partial="keys-panel")
        return _tokens_page(request, ApiTokenForm(), notice=notice, partial="tokens-panel")
    messages.success(request, notice)
    return redirect(page)


@login_required
@require_http_methods(["GET", "POST"])
def ssh_key_list(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _ssh_keys_page(request, SshKeyForm())
    form = SshKeyForm(request.POST)
    if form.is_valid():
        try:
            key = services.add_ssh_key(
                request.user,
                name=form.cleaned_data["name"],
                public_key=form.cleaned_data["public_key"],
                make_default=form.cleaned_data["make_default"],
                request=request,
            )
        except ValidationError as exc:
            _add_errors(form, exc)
        else:
            notice = _("SSH key “%(name)s” added.") % {"name": key.name}
            return _done(request, notice, "account:ssh-key-list")
    return _ssh_keys_page(request, form, partial="keys-panel")


@login_required
@require_POST
def ssh_key_delete(request: HttpRequest, public_id: str) -> HttpResponse:
    key = services.get_ssh_key_for_user(request.user, public_id)
    services.delete_ssh_key(request.user, key, request=request)
    return _done(
        request, _("SSH key “%(name)s” deleted.") % {"name": key.name}, "account:ssh-key-list"
    )


@login_required
@require_POST
def ssh_key_set_default(request: HttpRequest, public_id: str) -> HttpResponse:
    key = services.get_ssh_key_for_user(request.user, public_id)
    services.set_default_ssh_key(request.user, key)
    notice = _("“%(name)s” is now your default key.") % {"name": key.name}
    return _done(request, notice, "account:ssh-key-list")


# --- API tokens ---------------------------------------------------------------------------------
def _tokens_page(
    request: HttpRequest,
    form: ApiTokenForm,
    *,
    new_token: str | None = None,
    notice: str = "",
    partial: str | None = None,
) -> HttpResponse:
    tokens = ApiToken.objects.for_owner(request.user)
    context = {"tokens": tokens, "form": form, "new_token": new_token, "notice": notice}
    template = "console/account_tokens.html"
    if partial:
        response = render_page(request, template, context, partial)
    else:
        response = render(request, template, context)
    if new_token:
        response["Cache-Control"] = "no-store"  # the secret must not linger in any cache
    return response


@login_required
@require_http_methods(["GET", "POST"])
def token_list(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _tokens_page(request, ApiTokenForm())
    form = ApiTokenForm(request.POST)
    if form.is_valid():
        try:
            _token, raw = services.create_api_token(
                request.user,
                name=form.cleaned_data["name"],
                expires_at=form.expires_at(),
                request=request,
            )
        except ValidationError as exc:
            _add_errors(form, exc)
        else:
            # Rendered directly (no redirect): the secret exists only in this one response.
            return _tokens_page(request, ApiTokenForm(), new_token=raw, partial="tokens-panel")
    return _tokens_page(request, form, partial="tokens-panel")


@login_required
@require_POST
def token_revoke(request: HttpRequest, public_id: str) -> HttpResponse:
    token = services.get_api_token_for_user(request.user, public_id)
    services.revoke_api_token(request.user, token, request=request)
    return _done(
        request, _("Token “%(name)s” revoked.") % {"name": token.name}, "account:token-list"
    )


# Per client address, on top of allauth's one mail per address every few minutes (confirm_email).
RESEND_RATE_LIMIT = {"resend_verification": "10/h/ip"}


@require_POST
def resend_verification(request: HttpRequest) -> HttpResponse:
    """Send the verification link again, from the "check your inbox" page.

    The answer is the same whether or not an account waits on the address (no enumeration), and
    only an existing, unverified address gets a mail.
    """
    if not ratelimit.consume(
        request, app="allauth.account", action="resend_verification", config=RESEND_RATE_LIMIT
    ):
        return respond_429(request)
    form = ResendVerificationForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Enter the e-mail address you signed up with."))
        return redirect("account_email_verification_sent")
    address = (
        EmailAddress.objects.filter(email__iexact=form.cleaned_data["email"], verified=False)
        .select_related("user")
        .first()
    )
    if address is not None and consume_email_verification_rate_limit(request, address.email):
        address.send_confirmation(request)
    messages.info(
        request,
        _(
            "If an account is waiting for this address to be verified, a new link is on its way. "
            "It can take a few minutes; check the spam folder too."
        ),
    )
    return redirect("account_email_verification_sent")
