"""django-allauth hooks: which emails may sign up."""

from __future__ import annotations

from allauth.account.adapter import DefaultAccountAdapter

from console.validators import validate_not_disposable


class AccountAdapter(DefaultAccountAdapter):
    def clean_email(self, email: str) -> str:
        """Refuse throw-away mailboxes at sign-up and when adding an address."""
        email = super().clean_email(email)
        validate_not_disposable(email)
        return email
