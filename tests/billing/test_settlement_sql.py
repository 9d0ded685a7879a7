"""The settlement's per-session arithmetic runs in SQL (billing/settlement.py ``_charge_in_sql``);
the previous Python path is kept as the reference (``settle_usage_in_python``). Both must move the
same money, to the cent and the second, on SQLite (``make test``) and on PostgreSQL (the
``integration`` variants, run by ``make test-integration``).

Each scenario runs twice from the same start, once per path, inside a savepoint rolled back after
it; the books are compared by names, not ids: sessions, their charges, every posting and balance,
notices, and what each settlement reported.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction

from billing import clock, services
from billing.choices import AccountKind, CloseReason, Meter, UsageState
from billing.ledger import reconcile
from billing.models import (
    Account,
    BillingNotice,
    Entry,
    UsageCharge,
    UsageSession,
)
from billing.money import charge_for
from billing.settlement import (
    _charge_in_sql,
    _Run,
    _settle,
    settle_usage,
    settle_usage_in_python,
)
from console.models import User
from tests.billing.conftest import assert_ledger_consistent
from tests.console.factories import verify_personally

Settle = Callable[..., Any]
PATHS = {"sql": settle_usage, "python": settle_usage_in_python}
START = datetime(2026, 3, 1, 4, 0, 0, 250_000, tzinfo=UTC)


def _user(username: str) -> User:
    """A customer without a password (no hashing: these tests never log in)."""
    user = User.objects.create(username=username, email=f"{username}@example.com")
    verify_personally(user)  # 实名认证: these customers top up
    return user


def _session(user: User, rid: str, *, rate: str, cards: int, at: datetime, meter: str = "gpu"):
    wallet = services.get_or_create_wallet(user)
    return UsageSession.objects.create(
        wallet=wallet,
        resource_kind="storage" if meter == Meter.DISK else "instance",
        resource_id=rid,
        meter=meter,
        gpu_model="" if meter == Meter.DISK else "RTX 4090",
        cards=cards,
        rate=Decimal(rate),
        started_at=at,
        settled_at=at,
    )


def _topup(user: User, amount: str, ref: str) -> None:
    payment, _created = services.start_topup(user, amount)
    services.confirm_payment(
        str(payment.public_id), provider="sandbox", provider_txn_id=ref, amount=Decimal(amount)
    )


def _snapshot(results: list[Any]) -> dict[str, Any]:
    def account_key(account: Account) -> tuple[str, str, str]:
        owner = account.wallet.team.personal_of.username if account.wallet else "system"
        return (owner, account.kind, str(account.expires_at or ""))

    accounts = Account.objects.select_related("wallet__team__personal_of")
    return {
        "sessions": sorted(
            UsageSession.objects.values_list(
                "resource_id", "state", "settled_seconds", "charged", "close_reason", "ended_at"
            )
        ),
        "charges": sorted(
            UsageCharge.objects.values_list(
                "session__resource_id", "from_second", "to_second", "amount"
            )
        ),
        "entries": sorted(
            (
                e.transaction.kind,
                e.transaction.created_at,
                str(e.transaction.memo_params),
                *account_key(e.account),
                e.amount,
            )
            for e in Entry.objects.select_related(
                "transaction", "account__wallet__team__personal_of"
            ).filter(transaction__kind="usage")
        ),
        "balances": sorted((*account_key(a), a.balance) for a in accounts),
        "notices": sorted(
            BillingNotice.objects.values_list(
                "wallet__team__personal_of__username",
                "kind",
                "threshold_seconds",
                "message",
                "created_at",
            )
        ),
        "results": [
            (r.sessions, r.charged, r.transactions, len(r.stopped), r.warnings) for r in results
        ],
    }


def _random_scenario(seed: int, settle: Settle) -> dict[str, Any]:
    """Wallets with cash, trial credit and vouchers of several expiries (some nearly empty, so
    warnings and stops happen); GPU and disk sessions at 4-decimal rates, started at fractional
    seconds; settlements at steps of 0 s (a replay), fractions of a second, minutes and hours, a
    clock that goes back, closes and new sessions between them."""
    rng = random.Random(seed)
    frozen = clock.FrozenClock(START)
    results: list[Any] = []
    with clock.use_clock(frozen):
        users = [_user(f"u{seed}-{i}") for i in range(4)]
        for i, user in enumerate(users):
            if rng.random() < 0.7:
                services.grant_trial_credit(user)
            for v in range(rng.randint(0, 2)):
                services.grant_voucher(
                    user,
                    Decimal(rng.randint(1, 3000)) / 100,
                    reason=f"v{v}",
                    valid_days=rng.randint(1, 20),
                )
            if rng.random() < 0.5:
                _topup(user, str(rng.choice([1, 5, 50, 500])), f"t{seed}-{i}")
        sessions = 0

        def open_one(user: User) -> None:
            nonlocal sessions
            sessions += 1
            back = timedelta(seconds=rng.randint(0, 7200), microseconds=rng.randint(0, 999_999))
            if rng.random() < 0.25:
                _session(
                    user,
                    f"s{sessions}",
                    rate=rng.choice(["0.0100", "0.0123", "0.0007"]),
                    cards=rng.randint(1, 5000),
                    at=frozen.now() - back,
                    meter=Meter.DISK,
                )
            else:
                rate = Decimal(rng.randint(1, 200_000)) / 10000
                _session(
                    user,
                    f"s{sessions}",
                    rate=str(rate),
                    cards=rng.choice([1, 2, 3, 7, 8, 64]),
                    at=frozen.now() - back,
                )

        for user in users:
            for _ in range(rng.randint(1, 4)):
                open_one(user)
        for _ in range(10):
            step = rng.choice([0, 0.4, 1, 59.999999, 60, 61.5, 600, 3600, -30, 86400])
            frozen.advance(step)
            action = rng.random()
            open_ids = list(UsageSession.objects.open().values_list("pk", "wallet_id"))
            if action < 0.2 and open_ids:
                pk, wallet_id = rng.choice(open_ids)
                results.append(
                    settle(frozen.now(), wallet_ids=[wallet_id], close={pk: CloseReason.RELEASED})
                )
            elif action < 0.35:
                open_one(rng.choice(users))
            results.append(settle(frozen.now()))
        assert reconcile() == []
        assert_ledger_consistent()
        return _snapshot(results)


def _both_paths(scenario: Callable[[Settle], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    outcomes = {}
    for name, settle in PATHS.items():
        with transaction.atomic():
            outcomes[name] = scenario(settle)
            transaction.set_rollback(True)
    return outcomes


def _assert_random_scenarios_match(seeds: range) -> None:
    for seed in seeds:
        outcomes = _both_paths(lambda settle, seed=seed: _random_scenario(seed, settle))
        sql, python = outcomes["sql"], outcomes["python"]
        for part in sql:
            assert sql[part] == python[part], (seed, part)
        assert sql["charges"], seed  # the scenario charged something


@pytest.mark.django_db
def test_sql_settlement_moves_the_same_money_as_the_python_reference(
    prices, sandbox_payments
) -> None:
    _assert_random_scenarios_match(range(6))


@pytest.mark.integration
@pytest.mark.django_db
def test_sql_settlement_moves_the_same_money_as_the_python_reference_on_postgresql(
    prices, sandbox_payments
) -> None:
    _assert_random_scenarios_match(range(6))


# --- the arithmetic at its edges, each path ------------------------------------------------------
def _edge_cases(settle: Settle) -> dict[str, Any]:
    """Half-up at exactly half a cent, elapsed time with microseconds, big numbers."""
    frozen = clock.FrozenClock(START)
    with clock.use_clock(frozen):
        user = _user("edges")
        services.grant_voucher(user, Decimal("100000"), reason="edges", valid_days=3000)
        start = frozen.now()
        # 0.0180 元/card-h × 1 card: 1,000 s is exactly 0.005 元 (rounds up), 999 s 0.004995.
        _session(user, "half-gpu", rate="0.0180", cards=1, at=start - timedelta(seconds=1000))
        _session(user, "under-gpu", rate="0.0180", cards=1, at=start - timedelta(seconds=999))
        # 0.0100 元/GB·day × 3 GB: 14,400 s is exactly 0.005 元.
        _session(
            user,
            "half-disk",
            rate="0.0100",
            cards=3,
            at=start - timedelta(seconds=14400),
            meter=Meter.DISK,
        )
        # Started 0.000001 s after a whole second: 59.999999 s elapsed is 59 s.
        _session(
            user,
            "micro",
            rate="3600",
            cards=1,
            at=start - timedelta(seconds=59, microseconds=999_999),
        )
        # Large: 9,999.9999 元/card-h × 64 cards for 400 days; 100,000 GB of disk for as long.
        long_ago = start - timedelta(days=400)
        _session(user, "big-gpu", rate="9999.9999", cards=64, at=long_ago)
        _session(user, "big-disk", rate="0.0123", cards=100_000, at=long_ago, meter=Meter.DISK)
        result = settle(start)
        return {
            "result": (result.sessions, result.charged, result.transactions),
            "sessions": dict(
                UsageSession.objects.values_list("resource_id", "charged").order_by("resource_id")
            ),
            "seconds": dict(UsageSession.objects.values_list("resource_id", "settled_seconds")),
            "problems": reconcile(),
        }


def _assert_edges() -> None:
    outcomes = _both_paths(_edge_cases)
    assert outcomes["sql"] == outcomes["python"]
    charged, seconds = outcomes["sql"]["sessions"], outcomes["sql"]["seconds"]
    assert charged["half-gpu"] == Decimal("0.01") and charged["under-gpu"] == Decimal("0.00")
    assert charged["half-disk"] == Decimal("0.01")
    assert seconds["micro"] == 59 and charged["micro"] == Decimal("59.00")
    assert charged["big-gpu"] == charge_for(Decimal("9999.9999"), 64, 400 * 86400)
    assert charged["big-disk"] == charge_for(Decimal("0.0123"), 100_000, 400 * 86400, 86400)
    assert outcomes["sql"]["problems"] == []


@pytest.mark.django_db
def test_rounding_microseconds_and_big_numbers_match_the_reference(prices) -> None:
    _assert_edges()


@pytest.mark.integration
@pytest.mark.django_db
def test_rounding_microseconds_and_big_numbers_match_the_reference_on_postgresql(prices) -> None:
    _assert_edges()


# --- the spending order and what a run writes ---------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("path", sorted(PATHS))
def test_charges_take_vouchers_by_expiry_then_trial_then_cash(
    path: str, prices, sandbox_payments
) -> None:
    frozen = clock.FrozenClock(START)
    with clock.use_clock(frozen):
        user = _user("customer")
        later = services.grant_voucher(user, Decimal("3.00"), reason="later", valid_days=9)
        sooner = services.grant_voucher(user, Decimal("2.00"), reason="sooner", valid_days=2)
        services.grant_trial_credit(user)  # 10.00
        _topup(user, "50", "order")
        # 36 元/card-h × 1 card × 1,800 s = 18.00 元: 2 + 3 + 10 from credit, 3.00 from cash.
        _session(user, "order", rate="36", cards=1, at=frozen.now())
        frozen.advance(1800)
        PATHS[path](frozen.now())
        balances = {
            (a.kind, a.reason): a.balance
            for a in Account.objects.filter(wallet__team__personal_of=user)
        }
    assert balances[(AccountKind.VOUCHER, "sooner")] == Decimal("0.00")
    assert balances[(AccountKind.VOUCHER, "later")] == Decimal("0.00")
    assert balances[(AccountKind.TRIAL, "")] == Decimal("0.00")
    assert balances[(AccountKind.CASH, "")] == Decimal("47.00")
    assert sooner.pk and later.pk
    assert_ledger_consistent()


@pytest.mark.django_db
def test_a_replay_and_a_clock_gone_back_write_nothing(prices) -> None:
    frozen = clock.FrozenClock(START)
    with clock.use_clock(frozen):
        user = _user("customer")
        services.grant_trial_credit(user)
        _session(user, "r", rate="1.90", cards=8, at=frozen.now())
        frozen.advance(90)
        first = settle_usage(frozen.now())
        counts = (UsageCharge.objects.count(), Entry.objects.count())
        again = settle_usage(frozen.now())
        back = settle_usage(frozen.now() - timedelta(seconds=45))
        session = UsageSession.objects.get()
    assert first.charged == charge_for(Decimal("1.90"), 8, 90) and first.transactions == 1
    assert (again.charged, again.transactions, back.charged, back.transactions) == (0, 0, 0, 0)
    assert (UsageCharge.objects.count(), Entry.objects.count()) == counts
    assert session.settled_seconds == 90 and session.state == UsageState.OPEN


@pytest.mark.django_db
def test_a_session_opened_after_the_charge_step_is_not_stopped_before_it_is_charged(
    prices,
) -> None:
    """On PostgreSQL another transaction may open a session (started in the past) between the
    charge statement and the low-balance decision. The decision weighs only sessions charged up to
    now, so the newcomer is not closed with seconds never charged; the next run charges them."""
    frozen = clock.FrozenClock(START)
    with clock.use_clock(frozen):
        user = _user("customer")
        services.grant_voucher(user, Decimal("0.05"), reason="almost nothing", valid_days=5)
        _session(user, "old", rate="1.90", cards=8, at=frozen.now())
        frozen.advance(60)

        def charge_then_open(run: _Run) -> None:
            _charge_in_sql(run)
            _session(user, "late", rate="1.90", cards=8, at=frozen.now() - timedelta(seconds=30))

        with transaction.atomic():
            result = _settle(frozen.now(), None, None, charge_then_open)
        late = UsageSession.objects.get(resource_id="late")
        old = UsageSession.objects.get(resource_id="old")
        assert old.state == UsageState.CLOSED and old.close_reason == "insufficient_funds"
        assert result.stopped == [old.pk]
        assert late.state == UsageState.OPEN and late.settled_seconds == 0
        settle_usage(frozen.now())
        late.refresh_from_db()
        assert late.settled_seconds == 30 and late.charged == charge_for(Decimal("1.90"), 8, 30)
        assert reconcile() == []
