"""Template filters every app uses: money in 元, durations, state badges."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django import template
from django.utils.html import format_html
from django.utils.translation import ngettext, pgettext

register = template.Library()


@register.filter
def yuan(value: object, places: int = 2) -> str:
    """Format an amount of money in 元: ``1234.5`` → ``1,234.50 元``. Never goes through float."""
    if value is None or value == "":
        return "—"
    try:
        amount = value if isinstance(value, Decimal) else Decimal(str(value))
    except (InvalidOperation, ValueError):
        return str(value)
    quantum = Decimal(1).scaleb(-int(places))
    amount = amount.quantize(quantum, rounding=ROUND_HALF_UP)
    return f"{amount:,} 元"


# Units from the largest down; a duration shows its largest unit and, when not zero, the next one.
_UNITS = (("days", 86400), ("hours", 3600), ("minutes", 60), ("seconds", 1))


def _one_unit(unit: str, n: int) -> str:
    if unit == "days":
        return ngettext("%(n)d day", "%(n)d days", n) % {"n": n}
    if unit == "hours":
        return ngettext("%(n)d hour", "%(n)d hours", n) % {"n": n}
    if unit == "minutes":
        return ngettext("%(n)d minute", "%(n)d minutes", n) % {"n": n}
    return ngettext("%(n)d second", "%(n)d seconds", n) % {"n": n}


def _two_units(unit: str, first: int, second: int) -> str:
    values = {"a": first, "b": second}
    if unit == "days":
        return pgettext("duration", "%(a)d d %(b)d h") % values
    if unit == "hours":
        return pgettext("duration", "%(a)d h %(b)d min") % values
    return pgettext("duration", "%(a)d min %(b)d s") % values


@register.filter
def duration(seconds: object) -> str:
    """A span of seconds as people say it, in the active language.

    One unit when the next one down is zero (``72000`` → "20 hours" / "20 小时"), else the two
    largest (``5400`` → "1 h 30 min" / "1 小时 30 分"); smaller units are dropped, so a runway reads
    "2 d 3 h", not "2d 03h 00m 12s".
    """
    try:
        total = int(seconds)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return "—"
    sign = "-" if total < 0 else ""
    total = abs(total)
    for index, (unit, size) in enumerate(_UNITS):
        if total >= size or unit == "seconds":
            first, rest = divmod(total, size)
            if unit == "seconds":
                return sign + _one_unit(unit, first)
            second = rest // _UNITS[index + 1][1]
            text = _two_units(unit, first, second) if second else _one_unit(unit, first)
            return sign + text
    return "—"  # unreachable: the seconds unit always matches


@register.filter
def join_list(items: object) -> str:
    """``["A", "B", "C"]`` → "A, B and C" / "A、B和C": a list as a sentence in the active language."""
    words = [str(item) for item in items] if isinstance(items, list | tuple) else []
    if len(words) < 2:
        return "".join(words)
    head = pgettext("list separator", ", ").join(words[:-1])
    return pgettext("list", "%(items)s and %(last)s") % {"items": head, "last": words[-1]}


@register.simple_tag
def badge(label: object, colour: str = "secondary") -> str:
    """A Bootstrap badge; apps keep their state colours beside their TextChoices."""
    return format_html('<span class="badge badge-state text-bg-{}">{}</span>', colour, label)
