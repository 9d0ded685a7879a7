"""费用中心: 账单明细 lines (what vouchers, trial credit and cash paid of each) sum to the ledger to
the cent; the monthly bill by product, GPU model and member; CSV and XLSX exports from the page
and the API, with month and product filters; customer text cannot become a formula."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from decimal import Decimal

import openpyxl
import pytest
from rest_framework.test import APIClient

from billing import services
from billing.bills import lines
from billing.models import Entry
from tests.billing.factories import open_session

pytestmark = pytest.mark.django_db
MONTH = "2026-03"


@pytest.fixture
def march(billing_clock, prices, alice):
    """Alice's March: a voucher, the trial credit and cash pay two GPU sessions (settled every
    10 min for 3 h), a disk, a 1-day rental; one settlement is given back by a correction."""
    billing_clock.set(datetime(2026, 3, 10, 1, 0, tzinfo=UTC))
    services.grant_voucher(alice, Decimal("30"), reason="welcome", valid_days=60)
    services.grant_trial_credit(alice)
    payment, _ = services.start_topup(alice, "500")
    services.confirm_payment(
        str(payment.public_id), provider="sandbox", provider_txn_id="m1", amount=Decimal("500")
    )
    open_session(alice, resource_id="inst-a", label="=HYPERLINK(evil)", cards=8, region="xiamen")
    open_session(alice, resource_id="inst-b", gpu_model="A800", cards=1, region="ulanqab")
    services.open_usage_session(
        alice, resource_kind="storage", resource_id="disks", cards=200, meter="disk"
    )
    for _ in range(18):
        billing_clock.advance(600)
        services.settle_usage()
    services.purchase_term(
        alice,
        gpu_model="RTX 4090",
        cards=1,
        days=1,
        resource_kind="instance",
        resource_id="inst-c",
        region="xiamen",
    )
    usage = alice.personal_team.wallet.transactions.filter(kind="usage").order_by("id")[3]
    services.reverse_transaction(usage, reason="fault compensation")
    return alice


def test_lines_sum_to_the_ledger_to_the_cent(march) -> None:
    period, rows = lines.month_lines(march, MONTH)
    assert period == MONTH
    total = lines.totals(rows)
    assert total.amount == lines.ledger_month_total(march, MONTH) > 0
    assert total.voucher + total.trial + total.cash == total.amount
    # What each bucket paid, from the ledger itself.
    by_kind: dict[str, Decimal] = {}
    for kind, amount in (
        Entry.objects.filter(
            account__wallet__team__personal_of=march,
            transaction__kind__in=["usage", "term_purchase", "reversal"],
        )
        .exclude(transaction__kind="reversal", transaction__reverses__kind="topup")
        .values_list("account__kind", "amount")
    ):
        by_kind[kind] = by_kind.get(kind, Decimal(0)) - amount
    assert total.voucher == by_kind["voucher"] > 0
    assert total.trial == by_kind["trial"] > 0
    assert total.cash == by_kind["cash"]
    modes = {line.mode for line in rows}
    assert modes == {"on_demand", "term", "correction"}
    correction = next(line for line in rows if line.mode == "correction")
    assert correction.amount < 0
    # Each line's parts add up; a GPU line's usage is card-hours at the unit price.
    for line in rows:
        assert line.voucher + line.trial + line.cash == line.amount
    gpu = next(line for line in rows if line.resource_id == "inst-a")
    assert gpu.quantity == Decimal("1.3333") and gpu.unit_price == Decimal("1.90")
    # Another month is empty.
    assert lines.month_lines(march, "2026-04")[1] == []


def test_the_monthly_bill_groups_by_product_model_and_member(march) -> None:
    _period, rows = lines.month_lines(march, MONTH)
    whole = lines.totals(rows).amount
    for by in ("product", "region", "gpu_model", "member"):
        groups = lines.summary(rows, by)
        assert sum((g.totals.amount for g in groups), Decimal(0)) == whole
    assert {g.key for g in lines.summary(rows, "product")} == {"instance", "storage"}
    assert [g.key for g in lines.summary(rows, "member")] == ["alice"]
    # 地域: each GPU line where it ran (the correction where its charge was), storage account-wide.
    regions = {g.key: g.label for g in lines.summary(rows, "region")}
    assert set(regions) == {"xiamen", "ulanqab", "—"}
    _p, ulanqab = lines.month_lines(march, MONTH, region="ulanqab")
    assert ulanqab and {line.resource_id for line in ulanqab} == {"inst-b"}


def test_the_page_and_its_csv_and_xlsx_exports(march, alice_client) -> None:
    page = alice_client.get("/billing/bills/", {"month": MONTH}).content.decode()
    assert 'id="ledger-check"' in page and "text-success" in page
    _period, rows = lines.month_lines(march, MONTH)
    r = alice_client.get("/billing/bills/export/", {"format": "csv", "month": MONTH})
    assert r.status_code == 200 and r["Content-Type"].startswith("text/csv")
    assert f"bill-{MONTH}.csv" in r["Content-Disposition"]
    table = list(csv.reader(io.StringIO(r.content.decode("utf-8-sig"))))
    assert table[0][0] == "账单号" and "代金券抵扣" in table[0] and "现金金额" in table[0]
    assert table[0][4] == "地域" and {row[4] for row in table[1:]} >= {"厦门", "乌兰察布"}
    assert 'id="by-region"' in page and "厦门" in page
    assert len(table) == len(rows) + 1
    assert sum(Decimal(row[12]) for row in table[1:]) == lines.ledger_month_total(march, MONTH)
    assert all(not row[6].startswith("=") for row in table[1:])  # the label is neutralised
    assert any(row[6] == "'=HYPERLINK(evil)" for row in table[1:])
    english = alice_client.get(
        "/billing/bills/export/", {"format": "csv", "month": MONTH}, HTTP_ACCEPT_LANGUAGE="en"
    )
    assert english.content.decode("utf-8-sig").startswith("Bill no.,Billing period")
    x = alice_client.get("/billing/bills/export/", {"format": "xlsx", "month": MONTH})
    assert x.status_code == 200
    sheet = openpyxl.load_workbook(io.BytesIO(x.content)).active
    values = list(sheet.iter_rows(values_only=True))
    assert values[0][0] == "账单号" and len(values) == len(rows) + 1
    assert sum(Decimal(str(v[12])) for v in values[1:]) == lines.ledger_month_total(march, MONTH)
    assert all(v[6] is None or not str(v[6]).startswith("=") for v in values[1:])
    assert alice_client.get("/billing/bills/export/", {"format": "pdf"}).status_code == 400
    assert alice_client.get("/billing/bills/export/", {"month": "2026-13"}).status_code == 400


def test_filters_by_product_and_resource(march, alice_client) -> None:
    r = alice_client.get(
        "/billing/bills/export/", {"format": "csv", "month": MONTH, "product": "storage"}
    )
    table = list(csv.reader(io.StringIO(r.content.decode("utf-8-sig"))))[1:]
    assert table and all(row[3] == "存储" or row[5] == "disks" for row in table)
    _p, only_b = lines.month_lines(march, MONTH, resource="inst-b")
    assert only_b and {line.resource_id for line in only_b} == {"inst-b"}


def test_the_api_gives_the_bill_and_the_same_exports(march, bob) -> None:
    api = APIClient()
    api.force_authenticate(march)
    body = api.get("/api/v1/billing/bills/", {"month": MONTH}).json()
    assert Decimal(body["totals"]["amount"]) == Decimal(body["ledger_total"]) > 0
    assert {row["product"] for row in body["by_product"]} == {"instance", "storage"}
    r = api.get("/api/v1/billing/bills/export/", {"format": "csv", "month": MONTH})
    assert r.status_code == 200 and r["Content-Type"].startswith("text/csv")
    assert r.content.decode("utf-8-sig").startswith("账单号")
    x = api.get("/api/v1/billing/bills/export/", {"format": "xlsx", "month": MONTH})
    assert x.status_code == 200 and x.content[:2] == b"PK"
    assert api.get("/api/v1/billing/bills/", {"month": "03-2026"}).status_code == 400
    other = APIClient()
    other.force_authenticate(bob)
    assert other.get("/api/v1/billing/bills/", {"month": MONTH}).json()["lines"] == 0
