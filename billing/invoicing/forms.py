from __future__ import annotations

from django import forms
from django.utils.translation import gettext_lazy as _

from billing.invoicing.models import InvoiceKind, TitleType


class InvoiceRequestForm(forms.Form):
    kind = forms.ChoiceField(label=_("Invoice type"), choices=InvoiceKind.choices)
    title_type = forms.ChoiceField(label=_("Title type"), choices=TitleType.choices)
    title = forms.CharField(
        label=_("Invoice title"),
        max_length=200,
        required=False,
        help_text=_("Empty: your verified name or organisation."),
    )
    tax_id = forms.CharField(
        label=_("Taxpayer ID"),
        max_length=24,
        required=False,
        help_text=_("Empty: your organisation's unified social credit code."),
    )
    address_phone = forms.CharField(
        label=_("Address and phone (special VAT invoice)"), max_length=200, required=False
    )
    bank_account = forms.CharField(
        label=_("Bank and account number (special VAT invoice)"), max_length=200, required=False
    )
    email = forms.EmailField(label=_("Send to email"), required=False)
    amount = forms.DecimalField(
        label=_("Amount (元)"),
        max_digits=18,
        decimal_places=2,
        required=False,
        help_text=_("Empty: everything you can invoice now."),
    )


class OperatorActionForm(forms.Form):
    reason = forms.CharField(required=False, max_length=300)
