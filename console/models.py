from __future__ import annotations

import uuid

from django.contrib.auth.models import AbstractUser
from django.db import models
from django.utils.translation import gettext_lazy as _


class User(AbstractUser):
    """A console account. Customers own instances, wallets and keys; staff users are operators."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    email = models.EmailField(_("email address"), unique=True)

    class Meta(AbstractUser.Meta):
        swappable = "AUTH_USER_MODEL"

    @property
    def channel_group(self) -> str:
        """The websocket group that reaches every open console tab of this user."""
        return f"user.{self.public_id}"
