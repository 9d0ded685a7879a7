"""Audit the books: ``python manage.py billing_reconcile`` exits 1 and lists problems if any."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from billing.services import ledger_totals, reconcile


class Command(BaseCommand):
    help = "Check that sessions, postings, balances and payments reconcile (read-only)."

    def handle(self, *args: Any, **options: Any) -> None:
        problems = reconcile()
        totals = ledger_totals()
        for kind, total in sorted(totals.items()):
            self.stdout.write(f"{kind:<16}{total:>18}")
        if problems:
            for problem in problems:
                self.stderr.write(problem)
            raise CommandError(f"{len(problems)} problem(s) found")
        self.stdout.write(self.style.SUCCESS("billing reconciles: no problems"))
