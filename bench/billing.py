"""Billing benchmark: bulk settlement of N open usage sessions, arithmetic in SQL against Python.

    uv run python bench/billing.py                           # SQLite (a throw-away test database)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gc_bench REDIS_URL=redis://127.0.0.1:6379/9 APPS_DOMAIN=localhost \\
      SECRET_KEY=$(python3 -c 'import secrets;print(secrets.token_urlsafe(64))') \\
      uv run python bench/billing.py --sessions 10000 50000  # PostgreSQL (creates test_<db>, drops it)

For each ``--sessions`` size it creates a throw-away test database (Django's test-database
machinery: ``test_<name>`` on PostgreSQL, in-memory on SQLite), funds --wallets wallets, opens the
sessions and, --rounds times, moves the billing clock 60 s and settles every session with each path,
alternating which goes first:

* old: ``settle_usage_in_python()`` — the previous production path, kept as the reference: the
  same steps, but every session read into Python and charged there (``charge_due``);
* new: ``settle_usage()`` — every session's charge computed, written and summed in SQL.

Then a replay at the same second (must charge nothing) and a sample of the naive per-session loop
(``settle_session_alone`` below). It prints wall time (including the commit, where PostgreSQL runs
the deferred foreign-key checks) and SQL statements of each, and checks the books: every
transaction sums to zero, cached balances equal the entries, every session's total is rate ×
seconds and equals its charges (``ledger.reconcile``), and both paths charged the same exact amount.
Targets on PostgreSQL: 10,000 sessions in under 1 s (issue 3), 50,000 in under 3 s (issue 21).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from billing.models import GpuPrice

# The checkout on the path and the script's own folder off it (bench/queue.py would shadow
# the standard library's queue for everything imported after).
_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent), *(p for p in sys.path if Path(p).resolve() != _HERE)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

TARGETS = {10_000: 1.0, 50_000: 3.0}  # PostgreSQL, seconds per bulk settlement


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sessions", type=int, nargs="+", default=[10_000], help="sizes to run, e.g. 10000 50000"
    )
    parser.add_argument("--wallets", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3, help="settlements per path and size")
    parser.add_argument(
        "--loop-sessions",
        type=int,
        default=200,
        help="how many sessions the naive per-session loop settles (a sample; 0 skips it)",
    )
    parser.add_argument(
        "--export-interval",
        type=int,
        default=60,
        help="the bill-export bench's settlement interval in s (60: 43,200 lines; 0 skips it)",
    )
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_test_environment

    setup_test_environment()
    status = 0
    for n in args.sessions:
        old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
        try:
            status |= run(args, n, connection)
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)
    if args.export_interval:
        from bench.bill_export import run_export

        old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
        try:
            status |= run_export(args.export_interval)
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)
    return status


class QueryCounter:
    """Counts every SQL statement sent to the database (no 9,000-query cap like Django's log)."""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        self.count = 0

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
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


Row = tuple[str, int, float, int, Decimal]  # (name, sessions, seconds, queries, charged)


def run(args: argparse.Namespace, sessions: int, connection: BaseDatabaseWrapper) -> int:
    from billing import clock, services
    from billing.models import UsageSession
    from billing.money import settlement_delta
    from billing.seed import seed_default_prices
    from billing.settlement import settle_usage_in_python

    frozen = clock.FrozenClock()
    clock.set_clock(frozen)
    seed_default_prices()
    _, price = services.current_gpu_price("RTX 4090")
    t0 = time.perf_counter()
    _fixtures(args, sessions, frozen.now(), price)
    setup_s = time.perf_counter() - t0

    paths: list[tuple[str, Callable[[], Any]]] = [
        ("old: arithmetic in Python", settle_usage_in_python),
        ("new: arithmetic in SQL", services.settle_usage),
    ]
    rows: list[Row] = []
    same_money = True
    rate, elapsed = price.on_demand_per_card_hour, 0
    for i in range(args.rounds):
        for name, settle in paths if i % 2 == 0 else paths[::-1]:
            frozen.advance(60)
            expected = settlement_delta(rate, 8, elapsed, elapsed + 60) * sessions
            elapsed += 60
            with QueryCounter(connection) as q:
                t = time.perf_counter()
                result = settle()
                secs = time.perf_counter() - t
            rows.append((name, result.sessions, secs, len(q), result.charged))
            same_money &= result.charged == expected
    with QueryCounter(connection) as q:  # a replay at the same second
        t = time.perf_counter()
        replay = services.settle_usage()
        rows.append(
            (
                "new: replay, same second",
                replay.sessions,
                time.perf_counter() - t,
                len(q),
                replay.charged,
            )
        )
    if args.loop_sessions:
        frozen.advance(60)
        ids = list(UsageSession.objects.order_by("pk").values_list("pk", flat=True))
        ids = ids[: args.loop_sessions]
        with QueryCounter(connection) as q:
            t = time.perf_counter()
            loop_charged = sum((settle_session_alone(pk) for pk in ids), Decimal("0"))
            secs = time.perf_counter() - t
        rows.append(("naive per-session loop (sample)", len(ids), secs, len(q), loop_charged))
        same_money &= loop_charged == settlement_delta(rate, 8, elapsed, elapsed + 60) * len(ids)
    return _report(args, sessions, connection.vendor, setup_s, rows, same_money)


def _fixtures(args: argparse.Namespace, sessions: int, now: datetime, price: GpuPrice) -> None:
    """Funded wallets and open sessions, in bulk (set-up is not what is measured)."""
    from billing.choices import AccountKind, TransactionKind
    from billing.models import Account, Entry, LedgerTransaction, UsageSession, Wallet
    from console.models import Membership, Team, User

    users = User.objects.bulk_create(
        [User(username=f"bench{i}", email=f"bench{i}@example.com") for i in range(args.wallets)]
    )
    teams = Team.objects.bulk_create(
        [Team(name=u.username, personal_of=u, pfs_key=str(u.public_id)) for u in users]
    )
    Membership.objects.bulk_create(
        [Membership(team=t, user=u, role="owner") for t, u in zip(teams, users, strict=True)]
    )
    wallets = Wallet.objects.bulk_create([Wallet(team=t) for t in teams])
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
            for i in range(sessions)
        ],
        batch_size=2000,
    )


def _report(
    args: argparse.Namespace,
    sessions: int,
    db: str,
    setup_s: float,
    rows: list[Row],
    same_money: bool,
) -> int:
    """Print the figures and check the books; 0 when every check holds."""
    from billing.ledger import reconcile
    from billing.models import Account, Entry

    by_txn: dict[int, Decimal] = defaultdict(Decimal)
    by_account: dict[int, Decimal] = defaultdict(Decimal)
    for txn_id, account_id, amount in Entry.objects.values_list("transaction", "account", "amount"):
        by_txn[txn_id] += amount
        by_account[account_id] += amount
    balanced = all(v == 0 for v in by_txn.values())
    cached_ok = all(a.balance == by_account[a.pk] for a in Account.objects.all())
    problems = reconcile()
    replay_ok = all(charged == 0 for name, _n, _s, _q, charged in rows if "replay" in name)
    print(
        f"billing settlement benchmark · {db} · {sessions:,} open sessions in {args.wallets:,} wallets"
    )
    print(f"  set-up (bulk fixtures, not measured): {setup_s:.2f} s")
    print(f"  {'run':<36}{'sessions':>10}{'time':>12}{'queries':>10}{'charged (元)':>16}")
    for name, n, secs, queries, charged in rows:
        print(f"  {name:<36}{n:>10,}{secs:>10.3f} s{queries:>10,}{charged:>16,}")
    old = statistics.median(s for name, _n, s, _q, _c in rows if name.startswith("old:"))
    new = statistics.median(s for name, _n, s, _q, _c in rows if name.startswith("new: arith"))
    print(
        f"  median of {args.rounds}: old {old:.3f} s ({old / sessions * 1e6:.1f} µs per session),"
        f" new {new:.3f} s ({new / sessions * 1e6:.1f} µs per session) → {old / max(new, 1e-9):.2f}× faster"
    )
    loop = [(n, s) for name, n, s, _q, _c in rows if name.startswith("naive")]
    if loop:
        n, secs = loop[0]
        print(f"  naive per-session loop: {secs / max(n, 1) * 1e6:,.0f} µs per session")
    print(
        f"  ledger: transactions balanced={balanced}, cached balances = entries: {cached_ok}, "
        f"sessions = rate × seconds = their charges: {not problems}, replay charged nothing: "
        f"{replay_ok}, every path charged the exact amount: {same_money}"
    )
    for problem in problems[:5]:
        print(f"    {problem}")
    target = TARGETS.get(sessions)
    if db == "postgresql" and target is not None:
        met = new < target
        print(
            f"  target (PostgreSQL, {sessions:,} sessions: < {target:g} s): {'met' if met else 'NOT met'}"
        )
    elif db != "postgresql":
        print("  targets are stated for PostgreSQL (10,000 sessions < 1 s, 50,000 < 3 s)")
    ok = balanced and cached_ok and not problems and replay_ok and same_money
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
