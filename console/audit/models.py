from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _


class AuditEntry(models.Model):
    """One action on a team (issue 30): its actor, what, on which object, before/after, from which
    address, when. Append-only: rows are never updated or deleted (``save`` refuses an update; the
    admin is read-only; on PostgreSQL a trigger refuses UPDATE and DELETE)."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    # No database constraint and no cascade: the log outlives the rows it names (append-only).
    team = models.ForeignKey(
        "console.Team",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="audit_entries",
        null=True,
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        related_name="+",
    )
    actor_label = models.CharField(max_length=254, blank=True)  # kept after the actor goes
    operator = models.BooleanField(default=False)  # an operator's action on the team
    action = models.CharField(_("action"), max_length=64, db_index=True)
    object_type = models.CharField(max_length=32, blank=True)
    object_id = models.CharField(max_length=64, blank=True)
    object_label = models.CharField(max_length=200, blank=True)
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        verbose_name = _("audit entry")
        verbose_name_plural = _("audit log")
        ordering = ("-at", "-id")
        indexes = (models.Index(fields=("team", "-at"), name="console_audit_team_at"),)

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action} {self.object_label}"

    def save(self, *args: object, **kwargs: object) -> None:
        if self.pk is not None:
            raise ValueError("audit entries are append-only")
        super().save(*args, **kwargs)
