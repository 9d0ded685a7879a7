"""Bank transfers (models of the billing app: ``billing.models`` imports this)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _


class BankTransfer(models.Model):
    """The remittance code of a pending bank-transfer top-up (a ``Payment`` of provider
    ``bank_transfer``), and how it was matched."""

    payment = models.OneToOneField(
        "billing.Payment", on_delete=models.PROTECT, related_name="bank_transfer"
    )
    remittance_code = models.CharField(_("remittance code"), max_length=12, unique=True)
    bank_reference = models.CharField(_("bank reference"), max_length=64, blank=True)
    matched_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    matched_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("bank transfer")
        verbose_name_plural = _("bank transfers")

    def __str__(self) -> str:
        return self.remittance_code
