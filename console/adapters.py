"""django-allauth hooks: which emails may sign up, how failed logins are counted."""

from __future__ import annotations

from typing import Any

from allauth.account.adapter import DefaultAccountAdapter
from django.contrib.auth import get_user_model
from django.db.models import Q
from django.http import HttpRequest

from console.validators import validate_not_disposable


def login_attempts_key(login: str) -> str:
    """One failed-login counter per account, whichever name (email or username) is typed.

    Without this, an attacker gets the allowance once per spelling of the account's name. Unknown
    names count under their own (lowercased) text.
    """
    login = (login or "").strip().lower()
    user_id = (
        get_user_model()
        .objects.filter(Q(email__iexact=login) | Q(username__iexact=login))
        .values_list("pk", flat=True)
        .first()
    )
    return f"user:{user_id}" if user_id is not None else f"login:{login}"


class AccountAdapter(DefaultAccountAdapter):
    def clean_email(self, email: str) -> str:
        """Refuse throw-away mailboxes at sign-up and when adding an address."""
        email = super().clean_email(email)
        validate_not_disposable(email)
        return email

    def _get_login_attempts_cache_key(self, request: HttpRequest, **credentials: Any) -> str:
        return login_attempts_key(credentials.get("email", credentials.get("username", "")))
