"""The AI applications strip of the dashboard (``{% featured_apps %}``): each app with its price
per hour on its recommended GPUs and how long the trial credit lasts there (issue 20). Prices only
(no capacity look-up): the dashboard stays cheap; the app's page says what is free now."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import template
from django.utils.translation import get_language

from billing import services as billing
from billing.services import gpu_model_key
from marketplace import aiapps
from marketplace.catalogue import GPU_LABELS
from slices.services.apps import app_hours

register = template.Library()


@register.inclusion_tag("slices/_featured_apps.html")
def featured_apps(
    rates: dict[str, Decimal] | None = None, trial: Decimal | None = None
) -> dict[str, Any]:
    """``rates``: on-demand 元 per card-hour by GPU model key, when the page has read the price
    book already (the dashboard); else one look at it for every app (not a quote each).
    ``trial``: what the account's trial credit has left (the dashboard's wallet); None for a
    visitor (the whole credit a new account gets). Spent, no app claims trial hours."""
    left = billing.TRIAL_CREDIT if trial is None else trial
    language = get_language() or "zh-hans"
    if rates is None:
        rates = {
            gpu_model_key(p.gpu_model): p.on_demand_per_card_hour
            for p, _terms in billing.price_list()
            if not p.is_placeholder
        }
    rows = []
    for app in aiapps.shipped_apps():
        option = app.recommended
        rate = rates.get(gpu_model_key(option.gpu_model))
        per_hour = (rate * option.recommended_cards).quantize(Decimal("0.01")) if rate else None
        rows.append(
            {
                "app": app,
                "name": app.localized_name(language),
                "cards": option.recommended_cards,
                "gpu": GPU_LABELS.get(option.gpu_model, option.gpu_model),
                "per_hour": per_hour,
                "trial_hours": app_hours(left, per_hour) if per_hour else None,
            }
        )
    return {"rows": rows, "trial_credit": billing.TRIAL_CREDIT}
