"""The verification records (models of the console app: ``console.models`` imports this)."""

from __future__ import annotations

import os
import uuid

from django.conf import settings
from django.core.files.storage import FileSystemStorage
from django.db import models
from django.utils.translation import gettext_lazy as _


class PrivateStorage(FileSystemStorage):
    """Files under ``PRIVATE_FILES_DIR`` (read at each use, so tests move it), never under a
    public URL: views that check the owner serve them."""

    @property
    def base_location(self) -> str:
        return str(settings.PRIVATE_FILES_DIR)

    @property
    def location(self) -> str:
        return os.path.abspath(self.base_location)


private_storage = PrivateStorage()


def _private_storage() -> PrivateStorage:
    return private_storage


class VerificationKind(models.TextChoices):
    PERSONAL = "personal", _("Individual")
    ENTERPRISE = "enterprise", _("Company")
    UNIVERSITY = "university", _("University or research institute")


ORGANISATION_KINDS = (VerificationKind.ENTERPRISE, VerificationKind.UNIVERSITY)


class VerificationState(models.TextChoices):
    PENDING = "pending", _("Under review")
    APPROVED = "approved", _("Verified")
    REJECTED = "rejected", _("Rejected")


VERIFICATION_STATE_BADGES = {
    VerificationState.PENDING: "warning",
    VerificationState.APPROVED: "success",
    VerificationState.REJECTED: "danger",
}


class Verification(models.Model):
    """One submission. An account is verified while its latest approved one stands; at most one
    is pending or approved at a time (a rejected one may be followed by another).

    Of a person only the name, the ID number masked and a keyed hash of it are kept (the hash
    tells a second account using the same number without keeping the number)."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="verifications"
    )
    kind = models.CharField(_("kind"), max_length=12, choices=VerificationKind.choices)
    state = models.CharField(
        _("state"),
        max_length=10,
        choices=VerificationState.choices,
        default=VerificationState.PENDING,
    )
    provider = models.CharField(max_length=20, blank=True)
    provider_reference = models.CharField(max_length=64, blank=True)
    real_name = models.CharField(_("name"), max_length=100, blank=True)
    id_number_masked = models.CharField(_("ID number"), max_length=18, blank=True)
    id_number_hash = models.CharField(max_length=64, blank=True, db_index=True)
    organisation_name = models.CharField(_("organisation"), max_length=200, blank=True)
    credit_code = models.CharField(_("unified social credit code"), max_length=18, blank=True)
    licence = models.FileField(
        _("business licence"), storage=_private_storage, upload_to="licences/", blank=True
    )
    licence_content_type = models.CharField(max_length=40, blank=True)
    contact_name = models.CharField(_("contact"), max_length=100, blank=True)
    contact_phone = models.CharField(_("contact phone"), max_length=30, blank=True)
    reason = models.CharField(_("reason"), max_length=300, blank=True)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("real-name verification")
        verbose_name_plural = _("real-name verifications")
        ordering = ("-created_at", "-id")
        constraints = (
            models.UniqueConstraint(
                fields=("owner",),
                condition=models.Q(state__in=("pending", "approved")),
                name="console_verification_one_live",
            ),
        )

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.display_name} ({self.state})"

    @property
    def display_name(self) -> str:
        return self.organisation_name or self.real_name

    @property
    def is_organisation(self) -> bool:
        return self.kind in ORGANISATION_KINDS

    @property
    def state_badge(self) -> str:
        return VERIFICATION_STATE_BADGES[VerificationState(self.state)]
