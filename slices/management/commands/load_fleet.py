"""``python manage.py load_fleet [FILE]``: create or update the fleet from a fleet file (idempotent).

Without FILE the shipped fleet (slices/fleets/shipped.yaml) is loaded. A bad file is rejected with
its line and the reason, and nothing changes.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from slices.fleetfile import SHIPPED_FLEET, FleetFileError, load_fleet_file
from slices.services import load_fleet


class Command(BaseCommand):
    help = "Create or update regions, clusters, SUs, nodes and GPUs from a fleet file (YAML)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", nargs="?", default=str(SHIPPED_FLEET))
        parser.add_argument("--check", action="store_true", help="validate only, change nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            spec = load_fleet_file(options["file"])
        except FleetFileError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"{options['file']}: {exc.strerror}") from None
        if options["check"]:
            self.stdout.write(f"{options['file']}: ok, {spec.gpu_count} GPUs")
            return
        report = load_fleet(spec)
        self.stdout.write(
            self.style.SUCCESS(
                f"fleet {options['file']}: {spec.gpu_count} GPUs; {report.summary()}"
            )
        )
        for hostname in report.missing_nodes[:20]:
            self.stdout.write(self.style.WARNING(f"not in the file any more: {hostname}"))
