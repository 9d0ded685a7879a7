"""Template helpers for the account pages: Bootstrap form fields and the wallet summary."""

from __future__ import annotations

from typing import Any

from django import forms, template
from django.utils.safestring import SafeString

from billing import services as billing_services

register = template.Library()

_CHECK_WIDGETS = (forms.CheckboxInput, forms.RadioSelect, forms.CheckboxSelectMultiple)


@register.filter
def bs_widget(field: forms.BoundField) -> SafeString:
    """Render a bound field's widget with Bootstrap's classes (and is-invalid on errors)."""
    widget = field.field.widget
    if isinstance(widget, _CHECK_WIDGETS):
        css = "form-check-input"
    elif isinstance(widget, forms.Select):
        css = "form-select"
    else:
        css = "form-control"
    if field.errors:
        css += " is-invalid"
    existing = widget.attrs.get("class", "")
    attrs = {"class": f"{existing} {css}".strip()}
    if field.help_text:
        attrs["aria-describedby"] = f"{field.auto_id}_helptext"
    return field.as_widget(attrs=attrs)


@register.filter
def is_checkbox(field: forms.BoundField) -> bool:
    return isinstance(field.field.widget, forms.CheckboxInput)


@register.simple_tag(takes_context=True)
def wallet_summary(context: template.Context) -> Any:
    """The signed-in user's wallet summary from billing (None for visitors)."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    try:
        from billing.services import get_wallet_summary
    except ImportError:  # billing's service layer not present in this checkout yet
        return None
    return get_wallet_summary(user)


@register.simple_tag
def trial_credit() -> Any:
    """The one-time trial credit a new verified account receives, from billing (not a literal)."""
    return billing_services.TRIAL_CREDIT
