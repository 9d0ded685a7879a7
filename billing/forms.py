from __future__ import annotations

from decimal import Decimal

from django import forms
from django.utils.translation import gettext_lazy as _

from billing.services import MAX_TOPUP, MIN_TOPUP


class TopUpForm(forms.Form):
    amount = forms.DecimalField(
        label=_("Amount (元)"),
        min_value=MIN_TOPUP,
        max_value=MAX_TOPUP,
        decimal_places=2,
        max_digits=12,
        initial=Decimal("100.00"),
    )


class QuoteForm(forms.Form):
    gpu_model = forms.CharField(label=_("GPU model"), max_length=40)
    cards = forms.IntegerField(label=_("Cards"), min_value=1, max_value=2048, initial=8)
    disk_gb = forms.IntegerField(
        label=_("Persistent disk (GB)"), min_value=0, max_value=100000, initial=0
    )


class VoucherGrantForm(forms.Form):
    amount = forms.DecimalField(
        label=_("Amount (元)"), min_value=Decimal("0.01"), decimal_places=2, max_digits=12
    )
    valid_days = forms.IntegerField(
        label=_("Valid for (days)"), min_value=1, max_value=3650, initial=90
    )
    reason = forms.CharField(label=_("Reason"), max_length=200)


class RefundForm(forms.Form):
    amount = forms.DecimalField(
        label=_("Amount (元)"), min_value=Decimal("0.01"), decimal_places=2, max_digits=12
    )
    reason = forms.CharField(label=_("Reason"), max_length=200)


class ReversalForm(forms.Form):
    reason = forms.CharField(label=_("Reason"), max_length=200)


class StatementMonthForm(forms.Form):
    # Years 2000-2099 only: year 0 or 9999-12 (whose end is year 10000) cannot be a datetime.
    month = forms.RegexField(regex=r"^20\d{2}-(0[1-9]|1[0-2])$", required=False)
