from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Self

from django.db import models
from django.db.models import Q

if TYPE_CHECKING:
    from console.models import User


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
    def for_owner(self, user: User) -> Self:
        return self.filter(wallet__owner=user)


class UsageSessionQuerySet(models.QuerySet):
    def open(self) -> Self:
        return self.filter(state="open")

    def for_owner(self, user: User) -> Self:
        return self.filter(wallet__owner=user)
