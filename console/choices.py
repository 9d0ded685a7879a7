from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy


class SshKeyType(models.TextChoices):
    ED25519 = "ssh-ed25519", "Ed25519"
    ECDSA_P256 = "ecdsa-sha2-nistp256", "ECDSA P-256"
    ECDSA_P384 = "ecdsa-sha2-nistp384", "ECDSA P-384"
    ECDSA_P521 = "ecdsa-sha2-nistp521", "ECDSA P-521"
    RSA = "ssh-rsa", "RSA"


class ApiTokenState(models.TextChoices):
    ACTIVE = "active", _("Active")
    EXPIRED = "expired", _("Expired")
    REVOKED = "revoked", _("Revoked")


API_TOKEN_STATE_BADGES = {
    ApiTokenState.ACTIVE: "success",
    ApiTokenState.EXPIRED: "secondary",
    ApiTokenState.REVOKED: "danger",
}


class TokenLifetime(models.TextChoices):
    """Expiry choices offered by the token form (days; empty = never)."""

    NEVER = "", _("Never expires")
    WEEK = "7", _("7 days")
    MONTH = "30", _("30 days")
    QUARTER = "90", _("90 days")
    YEAR = "365", _("1 year")


class TeamRole(models.TextChoices):
    """A member's role in a team (issue 30); console/roles.py says what each may do."""

    OWNER = "owner", pgettext_lazy("team role", "Owner")
    ADMIN = "admin", pgettext_lazy("team role", "Admin")
    BILLING = "billing", pgettext_lazy("team role", "Billing")
    DEVELOPER = "developer", pgettext_lazy("team role", "Developer")
    VIEWER = "viewer", pgettext_lazy("team role", "Viewer")
