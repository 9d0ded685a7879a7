"""The billing page and the monthly statement as a Chinese-speaking customer reads them (issue 21):
storage rows in GB at 元 per GB·day (not under cards and a card-hour price), no English words,
one time zone per page (the console's, Asia/Shanghai), and which bucket paid each line."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime
from decimal import Decimal
from html.parser import HTMLParser

import pytest
from django.test import Client
from django.urls import reverse

from billing import services
from billing.choices import Meter
from console.models import User
from tests.billing.factories import open_session

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 1, 4, 0, 0, tzinfo=UTC)  # 12:00:00 in Asia/Shanghai


class _Tables(HTMLParser):
    """Rows of the tables with an id: ``{table id: [(row attributes, [cell text, …]), …]}``."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[tuple[dict[str, str], list[str]]]] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = {k: v or "" for k, v in attrs}
        if tag == "table" and named.get("id"):
            self._table = named["id"]
            self.tables[self._table] = []
        elif self._table and tag == "tr":
            self.tables[self._table].append((named, []))
        elif self._table and tag in ("td", "th") and self.tables[self._table]:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._cell is not None and self._table:
            self.tables[self._table][-1][1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _tables(html: str) -> dict[str, list[tuple[dict[str, str], list[str]]]]:
    parser = _Tables()
    parser.feed(html)
    return parser.tables


def _page(client: Client, name: str, language: str = "zh-hans", **params: str) -> str:
    response = client.get(reverse(name), params, HTTP_ACCEPT_LANGUAGE=language)
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture
def month_of_usage(alice: User, prices, sandbox_payments, billing_clock) -> User:
    """Trial credit, a sandbox top-up, an 8-card instance and 550 GB of storage (500 GB billed
    beyond the free 50), settled a few times; the clock at 12:00 Shanghai (04:00 UTC)."""
    billing_clock.set(START)
    services.grant_trial_credit(alice)
    payment, _created = services.start_topup(alice, "100", provider="sandbox")
    services.confirm_payment(
        str(payment.public_id), provider="sandbox", provider_txn_id="pages-1", amount=Decimal("100")
    )
    open_session(alice, resource_id="inst-1", cards=8, label="训练机")
    services.open_usage_session(
        alice,
        resource_kind="storage",
        resource_id="acct-1",
        cards=550,
        meter=Meter.DISK,
        label="550 GB",
    )
    for _ in range(3):
        billing_clock.advance(1200)
        services.settle_usage()
    return alice


def _row(rows: list[tuple[dict[str, str], list[str]]], meter: str) -> list[str]:
    (cells,) = [cells for attrs, cells in rows if attrs.get("data-meter") == meter]
    return cells


def test_storage_rows_are_sized_in_gb_at_a_price_per_gb_day(
    month_of_usage: User, alice_client: Client
) -> None:
    month = START.strftime("%Y-%m")
    for language, gb, cards, per_day, per_hour in (
        ("en", "500 GB billed", "8 cards", "0.0100 元/GB·day", "元/card-hour"),
        ("zh-hans", "计费 500 GB", "8 卡", "0.0100 元/GB·天", "元/卡时"),
    ):
        overview = _tables(_page(alice_client, "billing:overview", language))["usage-table"]
        statement = _tables(_page(alice_client, "billing:statement", language, month=month))
        for rows in (overview, statement["statement-usage"]):
            disk, gpu = _row(rows, "disk"), _row(rows, "gpu")
            # Columns: resource, specification, quantity, unit price (the rest as before).
            assert disk[2] == gb and disk[3] == per_day, (language, disk)
            assert gpu[2] == cards and gpu[3] == f"1.9000 {per_hour}", (language, gpu)
            assert disk[0].startswith("550 GB") and gpu[1] == "RTX 4090"


_ALLOWED = {"GPU", "RTX", "CSV", "GB", "HDR"}


def _words(html: str, ids: tuple[str, ...]) -> set[str]:
    """Latin words in the text of the elements with these ids (the billing parts of the page)."""
    words: set[str] = set()
    for element_id in ids:
        match = re.search(rf'id="{element_id}"[^>]*>(.*?)(</section>|</table>)', html, re.S)
        assert match, element_id
        text = re.sub(r"<[^>]+>", " ", match.group(1))
        words |= set(re.findall(r"[A-Za-z]{2,}", text)) - _ALLOWED
    return words


def test_no_english_words_in_the_chinese_billing_pages(
    month_of_usage: User, alice_client: Client
) -> None:
    overview = _page(alice_client, "billing:overview")
    assert _words(overview, ("billing-transactions", "billing-usage")) == set()
    assert "通过沙箱（测试支付）充值" in overview
    statement = _page(alice_client, "billing:statement", month=START.strftime("%Y-%m"))
    assert _words(statement, ("statement-lines", "statement-usage")) == set()


def test_one_time_zone_per_page(month_of_usage: User, alice_client: Client) -> None:
    """The usage settled at 04:20:00 UTC reads 12:20:00 (Asia/Shanghai) in its time column and in
    its description, on both pages and in both languages; nothing on them says UTC."""
    for name, table, params in (
        ("billing:overview", "transaction-table", {}),
        ("billing:statement", "statement-lines", {"month": START.strftime("%Y-%m")}),
    ):
        for language in ("zh-hans", "en"):
            html = _page(alice_client, name, language, **params)
            rows = [cells for _a, cells in _tables(html)[table]]
            (usage,) = [cells for cells in rows if cells[0] == "2026-03-01 12:20:00"]
            assert "2026-03-01 12:20:00" in usage[2], usage
            assert "UTC" not in html and "04:20:00" not in html, (name, language)


def test_the_html_statement_says_which_bucket_paid(
    month_of_usage: User, alice_client: Client
) -> None:
    month = START.strftime("%Y-%m")
    html_rows = _tables(_page(alice_client, "billing:statement", "zh-hans", month=month))[
        "statement-lines"
    ]
    header = html_rows[0][1]
    assert header[3:6] == ["现金", "体验金", "算力券"], header
    response = alice_client.get(reverse("billing:statement-csv"), {"month": month})
    csv_rows = list(csv.reader(io.StringIO(response.content.decode("utf-8-sig"))))[2:-1]
    lines = [cells for _a, cells in html_rows[2:-1]]  # less the header, opening and closing rows
    assert len(lines) == len(csv_rows) > 0

    def money(text: str) -> str:
        return text.replace(" 元", "").replace(",", "")

    for cells, row in zip(lines, csv_rows, strict=True):
        # CSV columns: time, transaction, kind, description, cash, trial, voucher, amount, balance
        assert [money(c) for c in cells[3:6]] == row[4:7], (cells, row)
    usage = [cells for cells in lines if cells[1] == "用量扣费"]
    assert len(usage) == 3
    # The trial credit pays first, then cash: the first settlement from the trial credit alone,
    # the second from both, the third from cash alone; the top-up went to cash.
    assert usage[0][3] == "" and usage[0][4].startswith("-")
    assert usage[1][3].startswith("-") and usage[1][4].startswith("-")
    assert usage[2][3].startswith("-") and usage[2][4] == ""
    assert any(cells[3] == "100.00 元" and cells[4] == "" for cells in lines)
