"""Billing benchmark: one bulk settlement of N open usage sessions against a per-session loop.

    uv run python bench/billing.py                           # SQLite (a throw-away test database)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gc_bench REDIS_URL=redis://127.0.0.1:6379/9 \\
      SECRET_KEY=$(python3 -c 'import secrets;print(secrets.token_urlsafe(64))') \\
      uv run python bench/billing.py                         # PostgreSQL (creates test_<db>, drops it)

It creates a throw-away test database (Django's test-database machinery: ``test_<name>`` on
PostgreSQL, in-memory on SQLite), funds --wallets wallets, opens --sessions usage sessions, moves the
billing clock 60 s and runs:

1. ``billing.services.settle_usage()`` once for every session (the production path, Celery beat);
2. the same call again at the same second (a replay: must charge nothing);
3. the baseline: ``settle_session_alone()`` (below) in a loop, one session at a time, for the next 60 s.

For each it prints wall time and SQL query count, then checks the ledger (every transaction sums
to zero, cached balances equal the entries, both runs charged the same amount).
Target (issue 3): one settlement of 10,000 sessions in under 1 s on PostgreSQL with at most 10 queries.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from billing.models import GpuPrice

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--wallets", type=int, default=1_000)
    parser.add_argument(
        "--baseline-sessions",
        type=int,
        default=None,
        help="how many sessions the per-session loop settles (default: all of them)",
    )
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_test_environment

    setup_test_environment()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        return run(args, connection)
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


class QueryCounter:
    """Counts every SQL statement sent to the database (no 9,000-query cap like Django's log)."""

    def __init__(self, connection) -> None:  # noqa: ANN001
        self.connection = connection
        self.count = 0

    def __call__(self, execute, sql, params, many, context):  # noqa: ANN001, ANN204
        self.count += 1
        return execute(sql, params, many, context)

    def __enter__(self) -> QueryCounter:
        self._cm = self.connection.execute_wrapper(self)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)

    def __len__(self) -> int:
        return self.count


def run(args: argparse.Namespace, connection) -> int:  # noqa: ANN001
    from billing import clock, services
    from billing.models import UsageSession
    from billing.money import settlement_delta
    from billing.seed import seed_default_prices

    frozen = clock.FrozenClock()
    clock.set_clock(frozen)
    seed_default_prices()
    _, price = services.current_gpu_price("RTX 4090")
    t0 = time.perf_counter()
    _fixtures(args, frozen.now(), price)
    setup_s = time.perf_counter() - t0

    # --- 1. one bulk settlement -----------------------------------------------------------------
    frozen.advance(60)
    with QueryCounter(connection) as bulk_q:
        t = time.perf_counter()
        bulk = services.settle_usage()
        bulk_s = time.perf_counter() - t
    # --- 2. a replay at the same second ---------------------------------------------------------
    with QueryCounter(connection) as replay_q:
        t = time.perf_counter()
        replay = services.settle_usage()
        replay_s = time.perf_counter() - t
    # --- 3. the per-session baseline for the next 60 s --------------------------------------------
    frozen.advance(60)
    ids = list(UsageSession.objects.order_by("pk").values_list("pk", flat=True))
    ids = ids[: args.baseline_sessions] if args.baseline_sessions else ids
    with QueryCounter(connection) as loop_q:
        t = time.perf_counter()
        loop_charged = sum((settle_session_alone(pk) for pk in ids), Decimal("0"))
        loop_s = time.perf_counter() - t

    rows = [
        ("bulk settle_usage()", bulk.sessions, bulk_s, len(bulk_q), bulk.charged),
        ("bulk replay, same second", replay.sessions, replay_s, len(replay_q), replay.charged),
        ("baseline: per-session loop", len(ids), loop_s, len(loop_q), loop_charged),
    ]
    expected_loop = settlement_delta(price.on_demand_per_card_hour, 8, 60, 120) * len(ids)
    return _report(args, connection.vendor, setup_s, rows, expected_loop)


def _fixtures(args: argparse.Namespace, now: datetime, price: GpuPrice) -> None:
    """Funded wallets and open sessions, in bulk (set-up is not what is measured)."""
    from billing.choices import AccountKind, TransactionKind
    from billing.models import Account, Entry, LedgerTransaction, UsageSession, Wallet
    from console.models import User

    users = User.objects.bulk_create(
        [User(username=f"bench{i}", email=f"bench{i}@example.com") for i in range(args.wallets)]
    )
    wallets = Wallet.objects.bulk_create([Wallet(owner=u) for u in users])
    cash = Account.objects.bulk_create(
        [Account(wallet=w, kind=AccountKind.CASH, balance=Decimal("100000.00")) for w in wallets]
    )
    Account.objects.bulk_create([Account(wallet=w, kind=AccountKind.TRIAL) for w in wallets])
    # The operator's revenue account exists after the first settlement ever; create it up front.
    Account.objects.create(wallet=None, kind=AccountKind.USAGE_REVENUE)
    payments = Account.objects.create(
        wallet=None, kind=AccountKind.PAYMENTS, balance=Decimal("-100000.00") * len(wallets)
    )
    txns = LedgerTransaction.objects.bulk_create(
        [
            LedgerTransaction(
                kind=TransactionKind.TOPUP, wallet=w, memo="bench funding", created_at=now
            )
            for w in wallets
        ]
    )
    Entry.objects.bulk_create(
        [
            Entry(transaction=t, account=a, amount=Decimal("100000.00"))
            for t, a in zip(txns, cash, strict=True)
        ]
        + [Entry(transaction=t, account=payments, amount=Decimal("-100000.00")) for t in txns]
    )
    UsageSession.objects.bulk_create(
        [
            UsageSession(
                wallet=wallets[i % len(wallets)],
                resource_kind="instance",
                resource_id=f"bench-{i}",
                label=f"bench {i}",
                gpu_model=price.gpu_model,
                cards=8,
                rate=price.on_demand_per_card_hour,
                price_book=price.price_book,
                started_at=now,
                settled_at=now,
            )
            for i in range(args.sessions)
        ],
        batch_size=2000,
    )


def _report(
    args: argparse.Namespace,
    db: str,
    setup_s: float,
    rows: list[tuple[str, int, float, int, Decimal]],
    expected_loop: Decimal,
) -> int:
    """Print the figures and check the ledger; 0 when every check holds."""
    from billing.models import Account, Entry

    bulk, replay, loop = rows  # (name, sessions, seconds, queries, charged) each
    _, bulk_n, bulk_s, bulk_q, _ = bulk
    replay_charged = replay[4]
    _, loop_n, loop_s, _, loop_charged = loop
    by_txn: dict[int, Decimal] = defaultdict(Decimal)
    by_account: dict[int, Decimal] = defaultdict(Decimal)
    for txn_id, account_id, amount in Entry.objects.values_list("transaction", "account", "amount"):
        by_txn[txn_id] += amount
        by_account[account_id] += amount
    balanced = all(v == 0 for v in by_txn.values())
    cached_ok = all(a.balance == by_account[a.pk] for a in Account.objects.all())
    print(
        f"billing settlement benchmark · {db} · {args.sessions:,} open sessions in {args.wallets:,} wallets"
    )
    print(f"  set-up (bulk fixtures, not measured): {setup_s:.2f} s")
    print(f"  {'run':<34}{'sessions':>10}{'time':>12}{'queries':>10}{'charged (元)':>16}")
    for name, n, secs, queries, charged in rows:
        print(f"  {name:<34}{n:>10,}{secs:>10.3f} s{queries:>10,}{charged:>16,}")
    per_bulk = bulk_s / max(bulk_n, 1) * 1e6
    per_loop = loop_s / max(loop_n, 1) * 1e6
    print(
        f"  per session: bulk {per_bulk:.1f} µs, loop {per_loop:.1f} µs → {per_loop / max(per_bulk, 1e-9):.1f}× faster"
    )
    print(
        f"  ledger: transactions balanced={balanced}, cached balances = entries: {cached_ok}, "
        f"replay charged nothing: {replay_charged == 0}, loop charged the same per session: {loop_charged == expected_loop}"
    )
    target = db == "postgresql" and bulk_s < 1 and bulk_q <= 10
    if db == "postgresql":
        print(f"  target (PostgreSQL: < 1 s and ≤ 10 queries): {'met' if target else 'NOT met'}")
    else:
        print(
            "  target is stated for PostgreSQL; SQLite splits bulk inserts by its parameter limit"
        )
    ok = balanced and cached_ok and replay_charged == 0 and loop_charged == expected_loop
    return 0 if ok else 1


def settle_session_alone(session_id: int) -> Decimal:
    """The naive per-session settlement (one lock, reads and writes per session): the baseline.

    The same money as ``billing.services.settle_usage`` for one session, through the ledger's
    own helpers; production never calls it.
    """
    from django.db import transaction

    from billing import clock
    from billing.choices import AccountKind, TransactionKind, UsageState
    from billing.ledger import post, spendable_accounts, spending_legs, system_account
    from billing.models import UsageCharge, UsageSession, Wallet
    from billing.money import ZERO, settlement_delta

    now = clock.now()
    with transaction.atomic():
        session = UsageSession.objects.get(pk=session_id)
        Wallet.objects.select_for_update().get(pk=session.wallet_id)
        session.refresh_from_db()
        if session.state != UsageState.OPEN:
            return ZERO
        until = max(int((now - session.started_at).total_seconds()), session.settled_seconds)
        delta = settlement_delta(
            session.rate, session.cards, session.settled_seconds, until, session.per_seconds
        )
        if delta:
            buckets = spendable_accounts(session.wallet, now)
            revenue = system_account(AccountKind.USAGE_REVENUE)
            legs = spending_legs(buckets, delta, revenue)
            txn = post(TransactionKind.USAGE, legs, wallet=session.wallet, at=now)
            UsageCharge.objects.create(
                session=session,
                transaction=txn,
                from_second=session.settled_seconds,
                to_second=until,
                amount=delta,
            )
        UsageSession.objects.filter(pk=session.pk).update(
            settled_seconds=until, charged=session.charged + delta, settled_at=now
        )
        return delta


if __name__ == "__main__":
    raise SystemExit(main())
