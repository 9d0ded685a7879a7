"""Template filters every app uses: money in 元, durations, state badges."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django import template
from django.utils.html import format_html

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


@register.filter
def duration(seconds: object) -> str:
    """``3725`` → ``1h 02m 05s``; days for long spans."""
    try:
        total = int(seconds)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return "—"
    sign = "-" if total < 0 else ""
    total = abs(total)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{sign}{days}d {hours:02d}h {minutes:02d}m"
    if hours:
        return f"{sign}{hours}h {minutes:02d}m {secs:02d}s"
    return f"{sign}{minutes}m {secs:02d}s"


@register.simple_tag
def badge(label: object, colour: str = "secondary") -> str:
    """A Bootstrap badge; apps keep their state colours beside their TextChoices."""
    return format_html('<span class="badge badge-state text-bg-{}">{}</span>', colour, label)
