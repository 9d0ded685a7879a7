"""Random sequences of top-ups, grants, refunds, session opens/closes and settlements.

After every sequence: every transaction sums to zero, cached balances equal their entries, no money
is created or lost (what came in minus what was charged, refunded or expired is what customers
hold), and every session's total equals rate × seconds under the one rounding rule.
"""

from __future__ import annotations

import contextlib
from decimal import Decimal

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing import clock, services
from billing.choices import AccountKind, TransactionKind
from billing.models import Account, LedgerTransaction, UsageSession
from billing.money import accrued, charge_for
from tests.billing.conftest import assert_ledger_consistent
from tests.console.factories import UserFactory

amounts = st.decimals(min_value="0.01", max_value="500", places=2)
op = st.one_of(
    st.tuples(
        st.just("topup"), st.integers(0, 2), st.decimals(min_value="1", max_value="500", places=2)
    ),
    st.tuples(st.just("voucher"), st.integers(0, 2), amounts, st.integers(1, 3)),
    st.tuples(st.just("trial"), st.integers(0, 2)),
    st.tuples(st.just("refund"), st.integers(0, 2), amounts),
    st.tuples(
        st.just("open"),
        st.integers(0, 2),
        st.integers(0, 5),
        st.sampled_from(["RTX 4090", "A800"]),
        st.sampled_from([1, 2, 8]),
    ),
    st.tuples(st.just("disk"), st.integers(0, 2), st.integers(0, 5), st.integers(10, 2000)),
    st.tuples(st.just("close"), st.integers(0, 5)),
    st.tuples(st.just("advance"), st.integers(1, 7200)),
    st.tuples(
        st.just("settle"),
    ),
    st.tuples(
        st.just("expire"),
    ),
)


@pytest.mark.django_db
@settings(
    max_examples=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(op, min_size=1, max_size=30))
def test_random_sequences_keep_the_ledger_whole(prices, ops) -> None:
    frozen = clock.FrozenClock()
    with clock.use_clock(frozen), transaction.atomic():
        users = [UserFactory() for _ in range(3)]
        for step in ops:
            kind, *args = step
            if kind == "topup":
                user, amount = users[args[0]], args[1]
                payment, _ = services.start_topup(user, amount)
                services.confirm_payment(
                    str(payment.public_id),
                    provider="sandbox",
                    provider_txn_id=f"t-{payment.pk}",
                    amount=amount,
                )
            elif kind == "voucher":
                services.grant_voucher(
                    users[args[0]], args[1], reason="property", valid_days=args[2]
                )
            elif kind == "trial":
                services.grant_trial_credit(users[args[0]])
            elif kind == "refund":
                with contextlib.suppress(services.InsufficientFunds):
                    services.refund_cash(users[args[0]], args[1], reason="property")
            elif kind == "open":
                services.open_usage_session(
                    users[args[0]],
                    resource_kind="instance",
                    resource_id=f"i-{args[1]}",
                    gpu_model=args[2],
                    cards=args[3],
                )
            elif kind == "disk":
                services.open_usage_session(
                    users[args[0]],
                    resource_kind="disk",
                    resource_id=f"d-{args[1]}",
                    cards=args[2],
                    meter="disk",
                )
            elif kind == "close":
                services.close_usage_session("instance", f"i-{args[0]}")
            elif kind == "advance":
                frozen.advance(args[0])
            elif kind == "settle":
                services.settle_usage()
            elif kind == "expire":
                services.expire_vouchers()
        services.settle_usage()
        assert_ledger_consistent()
        _assert_no_money_created_or_lost()
        assert services.reconcile() == []
        for session in UsageSession.objects.all():
            per = session.per_seconds
            assert session.charged == charge_for(
                session.rate, session.cards, session.settled_seconds, per
            )
            exact = accrued(session.rate, session.cards, session.settled_seconds, per)
            assert abs(session.charged - exact) <= Decimal("0.005")
            assert session.charged == sum((c.amount for c in session.charges.all()), Decimal(0))
        # no voucher or trial bucket is ever overdrawn; nothing was taken from an expired voucher
        assert not Account.objects.filter(kind__in=("trial", "voucher"), balance__lt=0).exists()
        transaction.set_rollback(True)


def _assert_no_money_created_or_lost() -> None:
    def total(kind: str) -> Decimal:
        return sum(
            (a.balance for a in Account.objects.filter(wallet__isnull=True, kind=kind)), Decimal(0)
        )

    held = sum((a.balance for a in Account.objects.filter(wallet__isnull=False)), Decimal(0))
    came_in = -total(AccountKind.PAYMENTS) - total(AccountKind.PROMOTIONS)
    went_out = (
        total(AccountKind.USAGE_REVENUE) + total(AccountKind.REFUNDS) + total(AccountKind.EXPIRED)
    )
    assert held == came_in - went_out
    charged = sum((s.charged for s in UsageSession.objects.all()), Decimal(0))
    assert charged == total(AccountKind.USAGE_REVENUE)
    assert LedgerTransaction.objects.filter(kind=TransactionKind.USAGE).count() >= 0


@pytest.mark.django_db
def test_reconciliation_finds_nothing_after_normal_use_and_flags_tampering(
    alice,
    prices,
    billing_clock,
) -> None:
    services.grant_trial_credit(alice)
    payment, _ = services.start_topup(alice, "50.00")
    services.confirm_payment(
        str(payment.public_id), provider="sandbox", provider_txn_id="x", amount=Decimal("50.00")
    )
    services.open_usage_session(
        alice, resource_kind="instance", resource_id="r", gpu_model="A800", cards=2
    )
    billing_clock.advance(3000)
    services.settle_usage()
    assert services.reconcile() == []
    assert services.reconcile(alice.personal_team.wallet) == []
    # a cached balance edited behind the ledger's back is reported
    Account.objects.filter(kind=AccountKind.CASH).update(balance=Decimal("1000000"))
    assert len(services.reconcile()) == 1


@pytest.mark.django_db
def test_reconcile_command(alice, prices) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    services.grant_trial_credit(alice)
    out = StringIO()
    call_command("billing_reconcile", stdout=out)
    assert "no problems" in out.getvalue()
    Account.objects.filter(kind=AccountKind.TRIAL).update(balance=Decimal("99"))
    with pytest.raises(CommandError):
        call_command("billing_reconcile", stdout=StringIO(), stderr=StringIO())
