from __future__ import annotations

from datetime import datetime, timedelta

from django import forms
from django.core.exceptions import ValidationError
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from console.choices import TokenLifetime
from console.validators import parse_ssh_public_key


class SshKeyForm(forms.Form):
    name = forms.CharField(
        label=_("Name"),
        max_length=100,
        required=False,
        help_text=_("Optional; defaults to the key's comment."),
    )
    public_key = forms.CharField(
        label=_("Public key"),
        widget=forms.Textarea(
            attrs={
                "rows": 4,
                "spellcheck": "false",
                "placeholder": "ssh-ed25519 AAAAC3Nza… you@laptop",
            }
        ),
        help_text=_(
            "One line from a .pub file: ssh-ed25519, ecdsa-sha2-nistp256/384/521 or ssh-rsa ≥ 2048 bits."
        ),
    )
    make_default = forms.BooleanField(label=_("Use by default for new instances"), required=False)

    def clean_public_key(self) -> str:
        value = self.cleaned_data["public_key"]
        try:
            parse_ssh_public_key(value)  # raises ValidationError with the precise reason
        except ValidationError as exc:
            if exc.code == "ssh_key_private_key":
                # A secret was pasted: never send it back into the page (or any cache of it).
                self.data = self.data.copy()
                self.data["public_key"] = ""
            raise
        return value


class ApiTokenForm(forms.Form):
    name = forms.CharField(
        label=_("Name"), max_length=100, help_text=_("What uses it, e.g. “CI pipeline”.")
    )
    lifetime = forms.ChoiceField(
        label=_("Expires"), choices=TokenLifetime.choices, required=False, initial="90"
    )

    def expires_at(self) -> datetime | None:
        days = self.cleaned_data.get("lifetime")
        return timezone.now() + timedelta(days=int(days)) if days else None


class ResendVerificationForm(forms.Form):
    email = forms.EmailField(label=_("E-mail address"), max_length=254)
