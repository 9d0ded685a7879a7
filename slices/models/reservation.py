"""Booked windows (预约, issue 32): a team's GPUs for a time ahead, paid when booked.

Rows are written only by ``slices.services.reservations``; every state change there is a
compare-and-set under the row's lock, and money moves through billing's services.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from console.querysets import TeamOwnedQuerySet
from slices.choices import RESERVATION_STATE_BADGES, ReservationState
from slices.models.fleet import GpuModel, Region
from slices.models.instances import Instance


class Reservation(models.Model):
    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    team = models.ForeignKey("console.Team", on_delete=models.PROTECT, related_name="reservations")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reservations"
    )
    name = models.CharField(_("name"), max_length=63)
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="reservations")
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="reservations")
    cards = models.PositiveIntegerField(_("cards"))
    image = models.CharField(_("image version"), max_length=120, blank=True)
    starts_at = models.DateTimeField(_("starts at"), db_index=True)
    hours = models.PositiveIntegerField(_("hours"))
    ends_at = models.DateTimeField(_("ends at"))
    state = models.CharField(
        _("state"), max_length=12, choices=ReservationState.choices, default=ReservationState.BOOKED
    )
    # The locked price: the term ladder's rate for the window's length (``term_days``: the rung;
    # None: shorter than the shortest term, the on-demand rate), and what was paid up front.
    rate_per_card_hour = models.DecimalField(max_digits=10, decimal_places=2)
    term_days = models.PositiveIntegerField(null=True, blank=True)
    total = models.DecimalField(max_digits=14, decimal_places=2)
    refunded = models.DecimalField(max_digits=14, decimal_places=2, default=0)
    # The GPUs that prove the window fits ([[hostname, [gpu, ...]], ...]): held in every plan
    # that overlaps the window (slices.topology.windows).
    pins = models.JSONField(default=list, blank=True)
    provision_lead_seconds = models.PositiveIntegerField(default=600)
    instance = models.OneToOneField(
        Instance, on_delete=models.PROTECT, null=True, blank=True, related_name="reservation"
    )
    # Decisions read fields: each notice is sent once (its time written in the sending
    # transaction, the notice's key unique besides).
    warned_day_at = models.DateTimeField(null=True, blank=True)
    warned_hour_at = models.DateTimeField(null=True, blank=True)
    delay_noted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    request_fingerprint = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TeamOwnedQuerySet.as_manager()

    class Meta:
        verbose_name = _("reservation")
        verbose_name_plural = _("reservations")
        ordering = ("starts_at", "id")
        constraints = (
            models.UniqueConstraint(
                fields=("team", "idempotency_key"),
                condition=models.Q(idempotency_key__isnull=False),
                name="slices_reservation_idempotency",
            ),
        )
        indexes = (models.Index(fields=("state", "starts_at")),)

    def __str__(self) -> str:
        return f"{self.name} {self.starts_at:%Y-%m-%d %H:%M}"

    @property
    def badge(self) -> str:
        return RESERVATION_STATE_BADGES.get(self.state, "secondary")  # type: ignore[call-overload]

    @property
    def provision_at(self) -> datetime:
        return self.starts_at - timedelta(seconds=self.provision_lead_seconds)
