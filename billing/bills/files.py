"""账单明细 as CSV (UTF-8 with a BOM, for Excel) or XLSX (openpyxl, write-only: rows stream)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import Any

from django.utils import timezone
from django.utils.translation import gettext as _

from billing.bills.lines import BillLine, item_label, mode_label, product_label


def headers() -> list[str]:
    return [
        _("Bill no."),  # 账单号
        _("Billing period"),  # 账期
        _("Charged at"),
        _("Product"),  # 产品
        _("Resource ID"),  # 资源 ID
        _("Name"),
        _("Billing item"),  # 计费项
        _("Billing method"),  # 计费方式
        _("GPU model"),
        _("Usage"),  # 用量
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


def row(line: BillLine) -> list[Any]:
    return [
        line.bill_no,
        line.period,
        timezone.localtime(line.charged_at).strftime("%Y-%m-%d %H:%M:%S"),
        product_label(line.product),
        safe_text(line.resource_id),
        safe_text(line.label),
        item_label(line.item),
        mode_label(line.mode),
        line.gpu_model,
        line.quantity,
        line.unit_price,
        line.amount,
        line.voucher,
        line.trial,
        line.cash,
        safe_text(line.member),
    ]


def to_csv(lines: Iterable[BillLine]) -> bytes:
    out = io.StringIO()
    out.write("\ufeff")
    writer = csv.writer(out)
    writer.writerow(headers())
    for line in lines:
        writer.writerow(row(line))
    return out.getvalue().encode("utf-8")


def to_xlsx(lines: Iterable[BillLine], title: str) -> bytes:
    from openpyxl import Workbook

    book = Workbook(write_only=True)
    sheet = book.create_sheet(title=title[:31])
    sheet.append(headers())
    for line in lines:
        sheet.append(row(line))  # Decimals are written exactly
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()
