"""Receivers for django-allauth's account signals.

Imported by ``console.account_urls`` (so it is connected in every process that serves requests,
before any verification can happen).
"""

from __future__ import annotations

from typing import Any

from allauth.account.signals import email_confirmed
from django.dispatch import receiver

from console import services


@receiver(email_confirmed, dispatch_uid="console.trial_credit_on_email_confirmed")
def grant_trial_credit_on_email_confirmed(sender: Any, email_address: Any, **kwargs: Any) -> None:
    # Fires for link verification and for the indirect proof of a password reset alike.
    services.on_email_verified(email_address.user_id, email_address.email)
