"""Prepare the embedded demo: the shipped fleet and catalogue, a demo customer and an operator.

Idempotent: run it any number of times (``make demo`` runs it at every start).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand
from django.db import transaction

from billing.services import grant_trial_credit
from console.services import mark_email_verified
from console.verification import services as verification

DEMO_USERS = (
    # username, email, password, is_staff
    ("demo", "demo@example.com", "demo-password-2026", False),
    ("ops", "ops@example.com", "ops-password-2026", True),
)

# GB 11643's own example number (a valid check character), for the sandbox provider.
DEMO_ID_NUMBER = "11010519491231002X"

# Data loaders of the apps, run when the app provides them (each is idempotent).
LOADERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("load_fleet", ()),  # slices/fleets/shipped.yaml: Xiamen, Yinchuan, Ulanqab
    ("load_catalogue", ()),  # marketplace/data/: models, datasets, one-click images
)


class Command(BaseCommand):
    help = "Load the demo fleet and catalogue and create the demo accounts (idempotent)."

    def handle(self, *args: object, **options: object) -> None:
        available = get_commands()
        for command, command_args in LOADERS:
            if command in available:
                call_command(command, *command_args, verbosity=0)
                self.stdout.write(f"loaded: {command} {' '.join(command_args)}".strip())
        with transaction.atomic():
            for username, email, password, is_staff in DEMO_USERS:
                self._ensure_user(username, email, password, is_staff)
        self.stdout.write(self.style.SUCCESS("demo ready"))

    def _ensure_user(self, username: str, email: str, password: str, is_staff: bool) -> None:
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(
            username=username,
            defaults={"email": email, "is_staff": is_staff, "is_superuser": is_staff},
        )
        if created:
            user.set_password(password)
            user.save(update_fields=["password"])
            self.stdout.write(f"created {'operator' if is_staff else 'customer'} {username}")
        # The demo addresses count as verified (allauth requires it to log in); the demo customer
        # gets the same one-time trial credit a verified sign-up gets (idempotent).
        mark_email_verified(user)
        if not is_staff:
            grant_trial_credit(user)
            # The demo needs no real-name verification (issue 33): its customer is verified by
            # the sandbox provider once, so top-ups and large slices work in the walkthrough.
            if verification.verified(user) is None:
                verification.submit_personal(user, real_name="演示用户", id_number=DEMO_ID_NUMBER)
