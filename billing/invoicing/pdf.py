"""The electronic invoice as a PDF: reportlab, with a Chinese TrueType font embedded (subset).

The font is ``INVOICE_FONT_PATH`` or the first of ``FONT_CANDIDATES`` found (``make system-deps``
installs fonts-wqy-microhei). A red-letter invoice (红字发票, 冲红) prints negative amounts and
the number of the invoice it reverses.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

FONT_CANDIDATES = (
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
)
FONT_NAME = "InvoiceCJK"
TAX_RATE = Decimal("0.06")  # 信息技术服务: 6 %
_CENT = Decimal("0.01")


def font_path() -> str:
    configured = settings.INVOICE_FONT_PATH
    candidates = (configured,) if configured else FONT_CANDIDATES
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    raise ImproperlyConfigured(
        "No Chinese font for invoice PDFs: run `make system-deps` (fonts-wqy-microhei) or set "
        f"INVOICE_FONT_PATH (looked for {', '.join(c for c in candidates if c)})"
    )


def _register_font() -> None:
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont

    if FONT_NAME not in pdfmetrics.getRegisteredFontNames():
        path = font_path()
        kwargs = {"subfontIndex": 0} if path.endswith(".ttc") else {}
        pdfmetrics.registerFont(TTFont(FONT_NAME, path, **kwargs))


_DIGITS = "零壹贰叁肆伍陆柒捌玖"
_UNITS = ("", "拾", "佰", "仟")
_SECTIONS = ("", "万", "亿", "万亿")


def _four(n: int) -> str:
    """0 < n < 10000 in capital numerals, with 零 for inner gaps."""
    out, zero = "", False
    for i in range(3, -1, -1):
        d = n // 10**i % 10
        if d:
            if zero and out:
                out += "零"
            out += _DIGITS[d] + _UNITS[i]
            zero = False
        elif out:
            zero = True
    return out


def amount_in_words(amount: Decimal) -> str:
    """人民币大写: 1234.50 → 壹仟贰佰叁拾肆圆伍角整; negative amounts start with 负."""
    value = amount.quantize(_CENT, rounding=ROUND_HALF_UP)
    sign = "负" if value < 0 else ""
    cents = int(abs(value) * 100)
    yuan, jiao, fen = cents // 100, cents // 10 % 10, cents % 10
    words, section, need_zero = "", 0, False
    n = yuan
    while n:
        part = n % 10000
        if part:
            text = _four(part) + _SECTIONS[section]
            if need_zero:
                text += "零"
            words = text + words
            need_zero = part < 1000
        elif words:
            need_zero = True
        n //= 10000
        section += 1
    words = words.rstrip("零")
    if yuan:
        words += "圆"
    if jiao:
        words += _DIGITS[jiao] + "角"
    elif yuan and fen:
        words += "零"
    if fen:
        words += _DIGITS[fen] + "分"
    else:
        words += "整"
    return sign + (words if cents else "零圆整")


@dataclass(frozen=True)
class InvoiceDocument:
    number: str
    issued_at: datetime
    kind_label: str  # 电子发票（普通发票） / 电子发票（增值税专用发票）
    buyer_name: str
    buyer_tax_id: str
    buyer_address_phone: str
    buyer_bank_account: str
    amount: Decimal  # tax included; negative on a red-letter invoice
    reverses_number: str = ""  # a red-letter invoice: the blue one it reverses
    note: str = ""


def split_tax(amount: Decimal) -> tuple[Decimal, Decimal]:
    """(amount before tax, tax) of a tax-included amount, to the cent, summing back to it."""
    net = (amount / (1 + TAX_RATE)).quantize(_CENT, rounding=ROUND_HALF_UP)
    return net, amount - net


def render(doc: InvoiceDocument) -> bytes:
    from reportlab.lib import colors
    from reportlab.lib.pagesizes import A5, landscape
    from reportlab.pdfgen import canvas

    _register_font()
    buffer = io.BytesIO()
    width, height = landscape(A5)
    pdf = canvas.Canvas(buffer, pagesize=(width, height), invariant=1)
    pdf.setTitle(f"{doc.kind_label} {doc.number}")
    pdf.setAuthor(settings.INVOICE_SELLER_NAME)
    red = bool(doc.reverses_number)
    ink = colors.HexColor("#a40000") if red else colors.HexColor("#7a4a00")
    pdf.setStrokeColor(ink)
    pdf.setFillColor(ink)
    pdf.setFont(FONT_NAME, 16)
    title = doc.kind_label + ("（红字）" if red else "")
    pdf.drawCentredString(width / 2, height - 40, title)
    pdf.setFont(FONT_NAME, 9)
    pdf.drawRightString(width - 30, height - 35, f"发票号码：{doc.number}")
    pdf.drawRightString(width - 30, height - 48, f"开票日期：{doc.issued_at:%Y年%m月%d日}")
    left, right, top = 30, width - 30, height - 62
    pdf.rect(left, 70, right - left, top - 70)
    mid = (left + right) / 2
    pdf.line(mid, top, mid, top - 70)
    pdf.line(left, top - 70, right, top - 70)
    pdf.setFillColor(colors.black)
    lines = [
        (
            "购买方",
            doc.buyer_name,
            doc.buyer_tax_id,
            doc.buyer_address_phone,
            doc.buyer_bank_account,
        ),
        ("销售方", settings.INVOICE_SELLER_NAME, settings.INVOICE_SELLER_TAX_ID, "", ""),
    ]
    for i, (who, name, tax_id, address_phone, bank) in enumerate(lines):
        x = left + 8 + i * (mid - left)
        y = top - 16
        pdf.setFont(FONT_NAME, 9)
        pdf.drawString(x, y, f"{who}  名称：{name}")
        pdf.drawString(x, y - 13, f"统一社会信用代码/纳税人识别号：{tax_id or '—'}")
        if address_phone:
            pdf.drawString(x, y - 26, f"地址电话：{address_phone}")
        if bank:
            pdf.drawString(x, y - 39, f"开户行及账号：{bank}")
    net, tax = split_tax(doc.amount)
    y = top - 90
    headers = ("项目名称", "数量", "金额", "税率", "税额")
    xs = (left + 8, left + 200, left + 260, left + 360, left + 420)
    for x, text in zip(xs, headers, strict=True):
        pdf.drawString(x, y, text)
    y -= 16
    row = ("*信息技术服务*GPU 算力服务", "1", f"{net:.2f}", "6%", f"{tax:.2f}")
    for x, text in zip(xs, row, strict=True):
        pdf.drawString(x, y, text)
    pdf.line(left, 110, right, 110)
    pdf.drawString(left + 8, 94, f"价税合计（大写）：{amount_in_words(doc.amount)}")
    pdf.drawRightString(right - 8, 94, f"（小写）¥{doc.amount:.2f}")
    note = doc.note
    if red:
        note = f"被红冲蓝字发票号码：{doc.reverses_number}" + (f"；{note}" if note else "")
    pdf.drawString(left + 8, 78, f"备注：{note}" if note else "备注：")
    pdf.setFont(FONT_NAME, 8)
    pdf.drawString(left, 55, f"开票人：{settings.INVOICE_SELLER_NAME}")
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()
