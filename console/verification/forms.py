from __future__ import annotations

from django import forms
from django.utils.translation import gettext_lazy as _

from console.verification.models import ORGANISATION_KINDS, VerificationKind


class PersonalForm(forms.Form):
    real_name = forms.CharField(label=_("Name (as on your ID card)"), max_length=100)
    id_number = forms.CharField(
        label=_("Resident ID number"),
        max_length=24,
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
    )


class OrganisationForm(forms.Form):
    kind = forms.ChoiceField(
        label=_("Kind"),
        choices=[(k.value, k.label) for k in VerificationKind if k in ORGANISATION_KINDS],
    )
    organisation_name = forms.CharField(label=_("Organisation name"), max_length=200)
    credit_code = forms.CharField(label=_("Unified social credit code"), max_length=24)
    licence = forms.FileField(label=_("Business licence (PNG, JPEG or PDF)"))
    contact_name = forms.CharField(label=_("Contact person"), max_length=100)
    contact_phone = forms.CharField(label=_("Contact phone"), max_length=30)


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "approve"), ("reject", "reject")])
    reason = forms.CharField(required=False, max_length=300)
