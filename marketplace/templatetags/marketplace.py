"""Display helpers for catalogue numbers: ``{{ asset.params_billion|params }}``, ``{{ gb|gigabytes }}``."""

from __future__ import annotations

from django import template
from django.utils.html import format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext as _

from marketplace import services
from marketplace.catalogue import GPU_LABELS

register = template.Library()


def _amount(value: float, places: int, unit: str) -> str:
    """``value`` rounded to ``places``, trailing zeros dropped, then ``unit``: 6.70 -> "6.7 B"."""
    return f"{value:,.{places}f}".rstrip("0").rstrip(".") + f" {unit}"


@register.filter
def params(value: float | None) -> str:
    """6.738 -> "6.74 B"; 0.135 -> "135 M"; None -> "—"."""
    if value is None:
        return "—"
    if value >= 1:
        return _amount(value, 2, "B")
    return _amount(value * 1000, 1, "M")


@register.filter
def gigabytes(value: float | None) -> str:
    """13.476 -> "13.5 GB"; 0.0182 -> "18.2 MB"; None -> "—"."""
    if value is None:
        return "—"
    if value >= 1000:
        return _amount(value / 1000, 2, "TB")
    if value >= 1:
        return _amount(value, 1, "GB")
    if value >= 0.001:
        return _amount(value * 1000, 1, "MB")
    return _("under 1 MB")


@register.simple_tag
def options(values: list, selected: object = None) -> str:
    """``<option>``s for a filter select, built in one pass (hundreds of publishers or tasks would
    otherwise cost a template loop with a comparison each). ``values``: strings or (value, label)."""
    chosen = "" if selected is None else str(selected)
    rows = ((v, v) if isinstance(v, str) else (v[0], v[1]) for v in values)
    return format_html_join(
        "",
        '<option value="{}"{}>{}</option>',
        (
            (value, mark_safe(" selected") if value == chosen else "", label)
            for value, label in rows
        ),  # noqa: S308
    )


@register.filter
def gpu_label(code: str) -> str:
    """Fleet code -> how people write it: ``RTX4090`` -> ``RTX 4090``."""
    return GPU_LABELS.get(code, code)


@register.filter
def can_mount(picker: object, asset: object) -> bool:
    """``{% if picker|can_mount:asset %}``: the asset is open or its license was accepted."""
    return bool(picker.can_mount(asset))  # type: ignore[attr-defined]


@register.filter
def catalogue_text(value: str) -> str:
    """Shipped catalogue prose (image and licence summaries, see marketplace/catalogue_text.py)
    in the reader's language."""
    return _(value) if value else ""  # gettext("") would be the catalogue's header


@register.simple_tag(takes_context=True)
def accepted_licenses(context: template.Context, assets: object) -> set[int]:
    """``{% accepted_licenses page.object_list as accepted %}``: the gated licences among
    ``assets`` the reader has accepted (no query when none of them is gated)."""
    gated = {a.license_id for a in assets if a.gated}  # type: ignore[attr-defined]
    if not gated:
        return set()
    user = getattr(context.get("request"), "user", None)
    return services.accepted_license_ids(user) & gated
