"""Invoices (models of the billing app: ``billing.models`` imports this)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from console.verification.models import private_storage


def _private_storage():  # noqa: ANN202 - the storage callable a FileField takes
    return private_storage


class InvoiceKind(models.TextChoices):
    NORMAL = "normal", _("Electronic general invoice")
    SPECIAL = "special", _("Electronic special VAT invoice")


class TitleType(models.TextChoices):
    PERSONAL = "personal", _("Individual")
    ORGANISATION = "organisation", _("Organisation")


class InvoiceState(models.TextChoices):
    REQUESTED = "requested", _("Requested")
    ISSUED = "issued", _("Issued")
    REJECTED = "rejected", _("Rejected")
    REVERSED = "reversed", _("Reversed (red-letter)")


INVOICE_STATE_BADGES = {
    InvoiceState.REQUESTED: "warning",
    InvoiceState.ISSUED: "success",
    InvoiceState.REJECTED: "secondary",
    InvoiceState.REVERSED: "danger",
}
# The states whose amount counts as invoiced (a request reserves its cash until decided).
HOLDING_STATES = (InvoiceState.REQUESTED, InvoiceState.ISSUED)


class Invoice(models.Model):
    """An invoice for cash the customer consumed. A request holds its amount (no other request
    can invoice the same cash); issuing renders its PDF; a red-letter reversal (冲红) releases the
    amount again; a rejected request releases it too."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    wallet = models.ForeignKey("billing.Wallet", on_delete=models.PROTECT, related_name="invoices")
    kind = models.CharField(_("invoice type"), max_length=10, choices=InvoiceKind.choices)
    title_type = models.CharField(_("title type"), max_length=12, choices=TitleType.choices)
    title = models.CharField(_("invoice title"), max_length=200)
    tax_id = models.CharField(_("taxpayer ID"), max_length=20, blank=True)
    address_phone = models.CharField(_("address and phone"), max_length=200, blank=True)
    bank_account = models.CharField(_("bank and account"), max_length=200, blank=True)
    email = models.EmailField(_("delivery email"), blank=True)
    amount = models.DecimalField(_("amount"), max_digits=18, decimal_places=2)  # billing MONEY
    state = models.CharField(
        _("state"), max_length=10, choices=InvoiceState.choices, default=InvoiceState.REQUESTED
    )
    number = models.CharField(
        _("invoice number"), max_length=20, unique=True, null=True, blank=True
    )
    pdf = models.FileField(storage=_private_storage, upload_to="invoices/", blank=True)
    red_number = models.CharField(max_length=20, unique=True, null=True, blank=True)
    red_pdf = models.FileField(storage=_private_storage, upload_to="invoices/", blank=True)
    reason = models.CharField(_("reason"), max_length=300, blank=True)
    requested_at = models.DateTimeField(_("requested"))
    decided_at = models.DateTimeField(_("issued"), null=True, blank=True)
    reversed_at = models.DateTimeField(_("reversed"), null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        verbose_name = _("invoice")
        verbose_name_plural = _("invoices")
        ordering = ("-requested_at", "-id")
        constraints = (
            models.CheckConstraint(
                condition=models.Q(amount__gt=0), name="billing_invoice_positive"
            ),
        )

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.amount} ({self.state})"

    @property
    def state_badge(self) -> str:
        return INVOICE_STATE_BADGES[InvoiceState(self.state)]
