from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from console.choices import API_TOKEN_STATE_BADGES, ApiTokenState, SshKeyType, TeamRole
from console.querysets import ApiTokenQuerySet, SshKeyQuerySet


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


class SshKey(models.Model):
    """An SSH public key a customer pastes once and picks when ordering instances."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ssh_keys"
    )
    name = models.CharField(_("name"), max_length=100)
    key_type = models.CharField(_("key type"), max_length=32, choices=SshKeyType.choices)
    public_key = models.TextField(_("public key"), help_text=_("<type> <base64>, no comment"))
    fingerprint = models.CharField(_("fingerprint"), max_length=64)
    comment = models.CharField(_("comment"), max_length=255, blank=True)
    bits = models.PositiveIntegerField(_("bits"))
    is_default = models.BooleanField(_("default for new instances"), default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = SshKeyQuerySet.as_manager()

    class Meta:
        verbose_name = _("SSH key")
        verbose_name_plural = _("SSH keys")
        ordering = ("-is_default", "name", "id")
        constraints = (
            # One key, one account (issue 29): the fingerprint of the canonical encoding
            # (console/sshkeys.py), so no re-encoding of a key can be a second account's.
            models.UniqueConstraint(fields=("fingerprint",), name="console_sshkey_one_account"),
            models.UniqueConstraint(fields=("owner", "name"), name="console_sshkey_unique_name"),
            models.UniqueConstraint(
                fields=("owner",),
                condition=models.Q(is_default=True),
                name="console_sshkey_one_default",
            ),
        )

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"

    @property
    def authorized_keys_line(self) -> str:
        """The line written into ``authorized_keys`` on the nodes (comment is printable ASCII)."""
        return f"{self.public_key} {self.comment}".rstrip()


class ApiToken(models.Model):
    """A personal API token. Only its SHA-256 is stored; the secret is shown once at creation.

    The token reads ``gct_<prefix>_<secret>``: ``prefix`` is a unique lookup key, the secret has
    256 bits of entropy, so a plain (unsalted) SHA-256 is enough and lookups stay one index hit.
    """

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    # A token acts in the one team it was made for (issue 30).
    team = models.ForeignKey("console.Team", on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(_("name"), max_length=100)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(_("expires"), null=True, blank=True)
    last_used_at = models.DateTimeField(_("last used"), null=True, blank=True)
    revoked_at = models.DateTimeField(_("revoked"), null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()
    # Not stored: the holder's membership in ``team``, as the authentication read it for the
    # request this token came with (console.authentication; console.tenancy reuses it).
    acting: Any = None

    class Meta:
        verbose_name = _("API token")
        verbose_name_plural = _("API tokens")
        ordering = ("-created_at", "-id")

    def __str__(self) -> str:
        return f"{self.name} (gct_{self.prefix}_…)"

    def state(self, now: datetime | None = None) -> ApiTokenState:
        if self.revoked_at is not None:
            return ApiTokenState.REVOKED
        if self.expires_at is not None and self.expires_at <= (now or timezone.now()):
            return ApiTokenState.EXPIRED
        return ApiTokenState.ACTIVE

    @property
    def state_badge(self) -> str:
        return API_TOKEN_STATE_BADGES[self.state()]

    @property
    def display_prefix(self) -> str:
        return f"gct_{self.prefix}_…"


class TrialCreditClaim(models.Model):
    """One trial credit per mailbox, ever: survives account deletion, sees through +tags.

    ``mailbox`` is the canonical form of the verified address (``services.canonical_mailbox``):
    lower case, ``+tag`` removed, dots ignored at Gmail.
    """

    mailbox = models.CharField(max_length=254, unique=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = _("trial credit claim")
        verbose_name_plural = _("trial credit claims")

    def __str__(self) -> str:
        return self.mailbox


class Team(models.Model):
    """The customer (issue 30): it owns instances, disks, /pfs, quotas, the wallet and its ledger.

    Every account has a personal team (created with the account, ``console/signals.py``), which
    takes no members; a lab or start-up creates a team and invites people with a role.
    ``pfs_key`` names the team's directory on the parallel file system: a personal team keeps its
    account's directory (the account's public id), so nothing moves on a node.
    """

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    name = models.CharField(_("name"), max_length=100)
    personal_of = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="personal_team",
    )
    pfs_key = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    # Closed by its owner (nothing running, no disks, no money left): its rows stay for the
    # bills and the audit log, its members are gone.
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("team")
        verbose_name_plural = _("teams")
        ordering = ("name", "id")

    def __str__(self) -> str:
        return self.name

    def save(self, *args: object, **kwargs: object) -> None:
        if not self.pfs_key:
            self.pfs_key = str(self.personal_of.public_id if self.personal_of else self.public_id)
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    @property
    def personal(self) -> bool:
        return self.personal_of_id is not None

    @property
    def contact_label(self) -> str:
        """How operators see the customer: a personal team's email, else the team's name."""
        return self.personal_of.email if self.personal_of else self.name

    @property
    def channel_group(self) -> str:
        """The websocket group that reaches every open console tab acting in this team."""
        return f"team.{self.public_id}"


class Membership(models.Model):
    """A user's place in a team: a role, and (set by owner/admin/billing) a monthly budget in 元
    and a card quota that every order and start of theirs is checked against."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(_("role"), max_length=12, choices=TeamRole.choices)
    budget_monthly = models.DecimalField(
        _("monthly budget (元)"), max_digits=12, decimal_places=2, null=True, blank=True
    )
    gpu_quota = models.PositiveIntegerField(_("card quota"), null=True, blank=True)
    stop_on_budget = models.BooleanField(_("stop on exhaustion"), default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = _("membership")
        verbose_name_plural = _("memberships")
        ordering = ("team", "created_at", "id")
        constraints = (
            models.UniqueConstraint(fields=("team", "user"), name="console_membership_once"),
        )

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


# Real-name verification keeps its models in its own package (console/verification/).
from console.audit.models import AuditEntry  # noqa: E402, F401
from console.notices.models import Notice, NoticePreference  # noqa: E402, F401
from console.teams.models import Invitation  # noqa: E402, F401
from console.verification.models import Verification  # noqa: E402, F401
