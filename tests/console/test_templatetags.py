from __future__ import annotations

from decimal import Decimal

from console.templatetags.console import badge, duration, yuan


def test_yuan_formats_decimal_with_half_up_rounding() -> None:
    assert yuan(Decimal("1234.5")) == "1,234.50 元"
    assert yuan(Decimal("0.005")) == "0.01 元"
    assert yuan("3.5") == "3.50 元"
    assert yuan(Decimal("1.23456"), 4) == "1.2346 元"
    assert yuan(None) == "—"
    assert yuan("not money") == "not money"


def test_duration_is_compact() -> None:
    assert duration(5) == "0m 05s"
    assert duration(3725) == "1h 02m 05s"
    assert duration(2 * 86400 + 3600) == "2d 01h 00m"
    assert duration(None) == "—"


def test_badge_escapes_its_label() -> None:
    assert badge("<b>x</b>", "success") == (
        '<span class="badge badge-state text-bg-success">&lt;b&gt;x&lt;/b&gt;</span>'
    )
