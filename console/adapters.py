"""django-allauth hooks: which emails may sign up and log in, how failed logins are counted."""

from __future__ import annotations

from typing import Any

from allauth.account.adapter import DefaultAccountAdapter
from allauth.account.auth_backends import AuthenticationBackend
from allauth.account.models import EmailAddress
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import Q
from django.http import HttpRequest

from console.validators import validate_not_disposable


def account_for_login(login: str) -> int | None:
    """The account a typed login name points at: username, primary email or any added address.

    Verified addresses first (an unverified copy of someone's address on another account must
    not shift the counter away from its owner), then the username and the account's email field.
    """
    login = (login or "").strip().lower()
    if not login:
        return None
    user_id = (
        EmailAddress.objects.filter(email__iexact=login)
        .order_by("-verified", "-primary", "pk")
        .values_list("user_id", flat=True)
        .first()
    )
    if user_id is not None:
        return user_id
    return (
        get_user_model()
        .objects.filter(Q(username__iexact=login) | Q(email__iexact=login))
        .order_by("pk")
        .values_list("pk", flat=True)
        .first()
    )


def login_attempts_key(login: str) -> str:
    """One failed-login counter per account, whichever name or address is typed.

    Without this, an attacker gets the allowance once per spelling of the account's name and
    once more per address added to it. Unknown names count under their own (lowercased) text.
    """
    user_id = account_for_login(login)
    return f"user:{user_id}" if user_id is not None else f"login:{(login or '').strip().lower()}"


class AccountAdapter(DefaultAccountAdapter):
    def clean_email(self, email: str) -> str:
        """Refuse throw-away mailboxes at sign-up and when adding an address."""
        email = super().clean_email(email)
        validate_not_disposable(email)
        return email

    def _get_login_attempts_cache_key(self, request: HttpRequest, **credentials: Any) -> str:
        return login_attempts_key(credentials.get("email", credentials.get("username", "")))


class AccountAuthenticationBackend(AuthenticationBackend):
    """allauth's email-or-username backend, but an address must be one the account may log in with.

    An address added to an account and never verified is not proof of anything: answering it
    like a login (allauth would send it to "verify your address" when the password is right)
    tells whoever typed it that the password is right. It is treated like an unknown address.
    An account whose only address is still unverified (just signed up) logs in as before, so
    allauth can send it to verify.
    """

    def _authenticate_by_email(self, email: str, password: str) -> AbstractBaseUser | None:
        user = super()._authenticate_by_email(email, password)
        if user is None or _may_log_in_with(user, email):
            return user
        return None


def _may_log_in_with(user: AbstractBaseUser, email: str) -> bool:
    addresses = list(EmailAddress.objects.filter(user=user).values_list("email", "verified"))
    typed = email.strip().lower()
    for address, verified in addresses:
        if address.lower() == typed:
            return verified or not any(v for _a, v in addresses)
    return True  # only the account's email field (accounts made outside allauth, e.g. the admin)
