from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import translation

from console.templatetags.console import badge, duration, yuan


def test_yuan_formats_decimal_with_half_up_rounding() -> None:
    assert yuan(Decimal("1234.5")) == "1,234.50 元"
    assert yuan(Decimal("0.005")) == "0.01 元"
    assert yuan("3.5") == "3.50 元"
    assert yuan(Decimal("1.23456"), 4) == "1.2346 元"
    assert yuan(None) == "—"
    assert yuan("not money") == "not money"


@pytest.mark.parametrize(
    ("seconds", "english", "chinese"),
    [
        (0, "0 seconds", "0 秒"),
        (1, "1 second", "1 秒"),
        (5, "5 seconds", "5 秒"),
        (60, "1 minute", "1 分钟"),
        (61, "1 min 1 s", "1 分 1 秒"),
        (3600, "1 hour", "1 小时"),
        (5400, "1 h 30 min", "1 小时 30 分"),
        (3725, "1 h 2 min", "1 小时 2 分"),
        (72000, "20 hours", "20 小时"),
        (86400, "1 day", "1 天"),
        (2 * 86400 + 3600 + 59, "2 d 1 h", "2 天 1 小时"),
        (-90, "-1 min 30 s", "-1 分 30 秒"),
    ],
)
def test_duration_reads_naturally_in_each_language(
    seconds: int, english: str, chinese: str
) -> None:
    with translation.override("en"):
        assert duration(seconds) == english
    with translation.override("zh-hans"):
        assert duration(seconds) == chinese


def test_duration_of_nothing_is_a_dash() -> None:
    assert duration(None) == "—"
    assert duration("soon") == "—"


def test_badge_escapes_its_label() -> None:
    assert badge("<b>x</b>", "success") == (
        '<span class="badge badge-state text-bg-success">&lt;b&gt;x&lt;/b&gt;</span>'
    )
