"""Notices and preferences (models of the console app: ``console.models`` imports this)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _


class Channel(models.TextChoices):
    INBOX = "inbox", _("In the console")
    MAIL = "mail", _("Mail")
    SMS = "sms", _("SMS")


class NoticePreference(models.Model):
    """How one account wants to hear: its language, its mobile number, and per event the channels
    (missing events use the event's defaults)."""

    owner = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notice_preference"
    )
    language = models.CharField(_("language"), max_length=10, default="zh-hans")
    phone = models.CharField(_("mobile number"), max_length=20, blank=True)
    channels = models.JSONField(default=dict, blank=True)
    # The customer's own low-balance threshold (元); armed until it warns, re-armed above it.
    low_balance_yuan = models.DecimalField(
        _("low-balance threshold (元)"), max_digits=18, decimal_places=2, null=True, blank=True
    )
    low_balance_armed = models.BooleanField(default=True)

    class Meta:
        verbose_name = _("notice preference")
        verbose_name_plural = _("notice preferences")

    def __str__(self) -> str:
        return f"{self.owner_id}: {self.language}"


class Notice(models.Model):
    """One event told to one account. ``key`` is unique: the same event notified again (a retried
    task, a replayed settlement) finds the row and sends nothing more. Each channel is claimed
    by setting its time (compare-and-set) before it is sent, so it goes out at most once."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    recipient = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notices"
    )
    event = models.CharField(_("event"), max_length=40)
    params = models.JSONField(default=dict, blank=True)
    link = models.CharField(max_length=200, blank=True)
    key = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    read_at = models.DateTimeField(null=True, blank=True)
    mailed_at = models.DateTimeField(null=True, blank=True)
    texted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("notice")
        verbose_name_plural = _("notices")
        ordering = ("-created_at", "-id")
        indexes = (models.Index(fields=("recipient", "read_at"), name="console_notice_unread"),)

    def __str__(self) -> str:
        return f"{self.event} → {self.recipient_id}"
