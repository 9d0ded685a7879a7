"""The 账单明细 export of a 128-card customer's month (issue 33: ≤ 10 s for CSV and for XLSX).

Run by ``bench/billing.py`` after its settlement sizes (``--export-interval 0`` skips it). A
128-card slice on demand, settled every ``interval`` seconds through the real settlement for 30
days (60 s, production's ``BILLING_SETTLEMENT_INTERVAL``, gives 43,200 charge lines), paid by a
voucher first and cash after; then the month's lines read, exported as CSV and as XLSX, timed, and
their total checked against the ledger to the cent.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from decimal import Decimal

TARGET_S = 10.0
DAYS = 30


def run_export(interval: int) -> int:
    from billing import clock, services
    from billing.bills import files, lines
    from console.models import User
    from console.verification import services as verification

    frozen = clock.FrozenClock(datetime(2026, 3, 1, 0, 0, 30, tzinfo=UTC))
    clock.set_clock(frozen)
    user = User.objects.create_user(username="bench-bills", email="bills@example.com")
    verification.submit_personal(user, real_name="Bench", id_number="11010519491231002X")
    services.grant_voucher(user, Decimal("20000"), reason="bench", valid_days=90)
    payment, _ = services.start_topup(user, Decimal("5000000"), provider="sandbox")
    services.confirm_payment(
        str(payment.public_id),
        provider="sandbox",
        provider_txn_id="bench-bills",
        amount=payment.amount,
    )
    services.open_usage_session(
        user, resource_kind="instance", resource_id="slice-128", gpu_model="A800", cards=128
    )
    t0 = time.perf_counter()
    steps = DAYS * 86400 // interval - 1  # the month's last settlement stays inside March
    for _ in range(steps):
        frozen.advance(interval)
        services.settle_usage()
    setup_s = time.perf_counter() - t0
    month = "2026-03"
    t = time.perf_counter()
    _period, rows = lines.month_lines(user, month)
    read_s = time.perf_counter() - t
    t = time.perf_counter()
    csv_bytes = files.to_csv(rows)
    csv_s = read_s + time.perf_counter() - t
    t = time.perf_counter()
    xlsx_bytes = files.to_xlsx(rows, month)
    xlsx_s = read_s + time.perf_counter() - t
    total = lines.totals(rows)
    ledger = lines.ledger_month_total(user, month)
    ok = total.amount == ledger and max(csv_s, xlsx_s) <= TARGET_S
    print(f"\n账单明细 export: a 128-card slice for {DAYS} days settled every {interval} s")
    print(f"  settled {steps} times in {setup_s:.1f} s; {len(rows):,} charge lines")
    print(f"  read lines      {read_s:6.2f} s")
    print(f"  CSV  ({len(csv_bytes) / 1e6:5.1f} MB) {csv_s:6.2f} s (read + write)")
    print(f"  XLSX ({len(xlsx_bytes) / 1e6:5.1f} MB) {xlsx_s:6.2f} s (read + write)")
    print(
        f"  total {total.amount} 元 = ledger {ledger} 元 "
        f"(vouchers {total.voucher}, cash {total.cash}): {'OK' if total.amount == ledger else 'MISMATCH'}"
    )
    print(f"  target ≤ {TARGET_S:.0f} s each: {'met' if ok else 'NOT MET'}")
    return 0 if ok else 1
