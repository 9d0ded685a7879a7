from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from console.choices import TeamRole


class Invitation(models.Model):
    """An invitation to a team by email with a role. Only the SHA-256 of its token is stored; the
    link in the mail expires after ``TEAM_INVITATION_DAYS`` (7) and works once."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    team = models.ForeignKey("console.Team", on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField(_("email address"))
    role = models.CharField(_("role"), max_length=12, choices=TeamRole.choices)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("invitation")
        verbose_name_plural = _("invitations")
        ordering = ("-created_at", "-id")

    def __str__(self) -> str:
        return f"{self.email} → {self.team} ({self.role})"
