from __future__ import annotations

from datetime import datetime
from typing import Self

from django.db import models
from django.db.models import Q


class PriceBookQuerySet(models.QuerySet):
    def effective_at(self, at: datetime) -> Self:
        return self.filter(effective_at__lte=at).order_by("-effective_at", "-version")


class AccountQuerySet(models.QuerySet):
    def spendable(self, at: datetime) -> Self:
        """Customer buckets money can be taken from at ``at`` (expired vouchers excluded)."""
        return self.filter(
            Q(kind__in=("cash", "trial")) | Q(kind="voucher", expires_at__gt=at, balance__gt=0)
        )


class LedgerTransactionQuerySet(models.QuerySet):
    def for_team(self, who: object) -> Self:
        from console.tenancy import team_of

        return self.filter(wallet__team=team_of(who))


class UsageSessionQuerySet(models.QuerySet):
    def open(self) -> Self:
        return self.filter(state="open")

    def for_team(self, who: object) -> Self:
        from console.tenancy import team_of

        return self.filter(wallet__team=team_of(who))
