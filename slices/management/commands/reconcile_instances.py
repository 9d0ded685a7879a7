"""Run the instance reconciler once (the same work as the beat task): re-drive stuck instances,
auto-release, free GPUs held by no live instance."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from slices.services.reconcile import reconcile


class Command(BaseCommand):
    help = "Re-drive stuck instances, release due ones and free leaked GPUs (idempotent)."

    def handle(self, *args: object, **options: object) -> None:
        self.stdout.write(str(reconcile()))
