"""The customer's own low-balance threshold (元, set on /notifications/): after a settlement or a
top-up, a wallet whose spendable balance fell below it is told once (inbox, mail, SMS by its
preferences); the alert re-arms when the balance is back at or above the threshold.

Runs after the settlement's commit, for the wallets that run charged: one query finds those with
a threshold, one reads their balances. Once per crossing: the arming flag is flipped by
compare-and-set, so concurrent runs warn once."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from decimal import Decimal

from django.db import transaction

from billing import clock
from billing.models import Account
from billing.money import ZERO
from console.notices import services as notices
from console.notices.models import NoticePreference

logger = logging.getLogger(__name__)


def check(wallet_ids: Iterable[int]) -> int:
    """Warn the people of ``wallet_ids`` (a team's owners and billing members, who set a
    threshold) whose balance crossed their threshold; returns how many were warned."""
    prefs = list(
        NoticePreference.objects.filter(
            owner__memberships__team__wallet__pk__in=list(wallet_ids),
            owner__memberships__role__in=("owner", "billing"),
            low_balance_yuan__isnull=False,
        ).values_list(
            "pk",
            "owner_id",
            "owner__memberships__team__wallet__pk",
            "low_balance_yuan",
            "low_balance_armed",
        )
    )
    if not prefs:  # the common case: one query
        return 0
    spendable: dict[int, Decimal] = defaultdict(lambda: ZERO)
    accounts = Account.objects.filter(wallet_id__in=[p[2] for p in prefs])
    for wallet_id, balance in accounts.spendable(clock.now()).values_list("wallet_id", "balance"):
        spendable[wallet_id] += balance
    warned = 0
    for pk, owner_id, wallet_id, threshold, armed in prefs:
        balance = spendable[wallet_id]
        if threshold is None or balance >= threshold:
            if not armed:
                NoticePreference.objects.filter(pk=pk).update(low_balance_armed=True)
            continue
        won = NoticePreference.objects.filter(pk=pk, low_balance_armed=True).update(
            low_balance_armed=False
        )
        if won != 1:  # already warned for this crossing
            continue
        try:
            with transaction.atomic():
                notices.notify_user_id(
                    owner_id,
                    "low_balance_threshold",
                    {"balance": balance, "threshold": threshold},
                    key=f"low-balance-threshold:{owner_id}:{clock.now().timestamp()}",
                    link="/billing/",
                )
            warned += 1
        except Exception:
            logger.exception("could not warn about a low balance")
    return warned
