"""Receivers for django-allauth's account signals.

Imported by ``console.account_urls`` (so it is connected in every process that serves requests,
before any verification can happen).
"""

from __future__ import annotations

from typing import Any

from allauth.account.signals import email_confirmed
from django.conf import settings
from django.db.models.signals import post_save
from django.dispatch import receiver

from console import hooks, services


@receiver(email_confirmed, dispatch_uid="console.trial_credit_on_email_confirmed")
def grant_trial_credit_on_email_confirmed(sender: Any, email_address: Any, **kwargs: Any) -> None:
    # Fires for link verification and for the indirect proof of a password reset alike.
    services.on_email_verified(email_address.user_id, email_address.email)


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="console.personal_team")
def personal_team_for_new_account(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    # Every account, however made (sign-up, createsuperuser, the admin, the demo), gets its
    # personal team, which owns what the person orders alone (issue 30).
    if created and not kwargs.get("raw"):
        from console.tenancy import personal_team

        team = personal_team(instance)
        hooks.team_created.send(sender=type(team), team=team)
