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
    """The account a typed login name points at: username, or an address it may log in with.

    An address is a login for its account when it is verified, or when the account has no
    verified address yet (just signed up: allauth sends it to verify). An added address never
    verified is not: it answers like an unknown address whatever the password
    (``AccountAuthenticationBackend``), so it must not count, nor be locked, with the account's
    failed logins either; else "too many attempts" on it would tell a stranger whose it is. The
    account's email field counts only when no address row names it (accounts made in the admin).
    """
    login = (login or "").strip().lower()
    if not login:
        return None
    rows = list(
        EmailAddress.objects.filter(email__iexact=login)
        .order_by("-verified", "-primary", "pk")
        .values_list("user_id", "verified")
    )
    for user_id, verified in rows:
        if verified or not EmailAddress.objects.filter(user_id=user_id, verified=True).exists():
            return user_id
    by_name = (
        Q(username__iexact=login) if rows else Q(username__iexact=login) | Q(email__iexact=login)
    )
    return (
        get_user_model().objects.filter(by_name).order_by("pk").values_list("pk", flat=True).first()
    )


def login_attempts_key(login: str) -> str:
    """One failed-login counter per account, whichever name or address it logs in with is typed.

    Without this, an attacker gets the allowance once per spelling of the account's name and
    once more per address added to it. Unknown names, and added addresses never verified, count
    under their own (lowercased) text: locked or not, such an address answers as an unknown one.
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
