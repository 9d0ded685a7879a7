"""Load the shipped catalogue (marketplace/data/) into the database. Safe to run any number of times."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from marketplace import services


class Command(BaseCommand):
    help = "Load the public models, datasets, licenses and one-click images (idempotent)."

    def handle(self, *args: object, **options: object) -> None:
        report = services.load_catalogue()
        self.stdout.write(report.summary())
