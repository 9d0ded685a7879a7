"""账单明细 as CSV (UTF-8 with a BOM, for Excel) or XLSX (XlsxWriter, rows streamed)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import Any

from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import pgettext

from billing.bills.lines import BillLine, item_label, mode_label, product_label, region_label


def headers() -> list[str]:
    return [
        _("Bill no."),  # 账单号
        _("Billing period"),  # 账期
        _("Charged at"),
        _("Product"),  # 产品
        _("Region"),  # 地域
        _("Resource ID"),  # 资源 ID
        _("Name"),
        _("Billing item"),  # 计费项
        _("Billing method"),  # 计费方式
        _("GPU model"),
        pgettext("bill quantity", "Usage"),  # 用量
        _("Unit price"),  # 单价
        _("List price"),  # 原价
        _("Voucher deduction"),  # 代金券抵扣
        _("Trial credit deduction"),
        _("Cash amount"),  # 现金金额
        _("Member"),
    ]


def safe_text(value: str) -> str:
    """Neutralise spreadsheet formulas in customer text (CSV / XLSX injection)."""
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


class _Rows:
    """Turns lines into rows; labels and times are formatted once per distinct value (a month of
    one slice is 43,200 lines with a handful of labels and one time per settlement)."""

    def __init__(self) -> None:
        self.products: dict[str, str] = {}
        self.regions: dict[str, str] = {}
        self.items: dict[str, str] = {}
        self.modes: dict[str, str] = {}
        self.times: dict[object, str] = {}

    def __call__(self, line: BillLine) -> list[Any]:
        product = self.products.get(line.product)
        if product is None:
            product = self.products[line.product] = product_label(line.product)
        region = self.regions.get(line.region)
        if region is None:
            region = self.regions[line.region] = region_label(line.region)
        item = self.items.get(line.item)
        if item is None:
            item = self.items[line.item] = item_label(line.item)
        mode = self.modes.get(line.mode)
        if mode is None:
            mode = self.modes[line.mode] = mode_label(line.mode)
        at = self.times.get(line.charged_at)
        if at is None:
            at = timezone.localtime(line.charged_at).strftime("%Y-%m-%d %H:%M:%S")
            self.times[line.charged_at] = at
        return [
            line.bill_no,
            line.period,
            at,
            product,
            region,
            safe_text(line.resource_id),
            safe_text(line.label),
            item,
            mode,
            line.gpu_model,
            line.quantity,
            line.unit_price,
            line.amount,
            line.voucher,
            line.trial,
            line.cash,
            safe_text(line.member),
        ]


def row(line: BillLine) -> list[Any]:
    return _Rows()(line)


def to_csv(lines: Iterable[BillLine]) -> bytes:
    out = io.StringIO()
    out.write("\ufeff")
    writer = csv.writer(out)
    writer.writerow(headers())
    rows = _Rows()
    writer.writerows(rows(line) for line in lines)
    return out.getvalue().encode("utf-8")


def to_xlsx(lines: Iterable[BillLine], title: str) -> bytes:
    """XlsxWriter in constant-memory mode (rows stream to a temporary file); customer text is
    never read as a formula, a number or a link."""
    import xlsxwriter

    out = io.BytesIO()
    book = xlsxwriter.Workbook(
        out,
        {
            "constant_memory": True,
            "strings_to_formulas": False,
            "strings_to_numbers": False,
            "strings_to_urls": False,
        },
    )
    sheet = book.add_worksheet(title[:31])
    sheet.write_row(0, 0, headers())
    rows = _Rows()
    for i, line in enumerate(lines, 1):
        sheet.write_row(i, 0, rows(line))
    book.close()
    return out.getvalue()
