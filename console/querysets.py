"""Tenant scoping shared by every customer-owned model: ``Model.objects.for_owner(user)``."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Self

from django.db import models
from django.db.models import Q
from django.utils import timezone

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser

    from console.models import User


class OwnedQuerySet(models.QuerySet):
    """Rows owned by one account. Anonymous callers see nothing; staff see only their own too."""

    owner_field = "owner"

    def for_owner(self, user: User | AnonymousUser | None) -> Self:
        if user is None or not getattr(user, "is_authenticated", False):
            return self.none()
        return self.filter(**{self.owner_field: user})


class TeamOwnedQuerySet(models.QuerySet):
    """Rows a team owns (issue 30): ``for_team(acting)`` takes an Acting, a Team or a user
    (their personal team). Anonymous callers see nothing."""

    def for_team(self, who: object) -> Self:
        if who is None or (hasattr(who, "is_authenticated") and not who.is_authenticated):
            return self.none()
        from console.tenancy import team_of

        return self.filter(team=team_of(who))


class SshKeyQuerySet(OwnedQuerySet):
    def defaults(self) -> Self:
        return self.filter(is_default=True)


class ApiTokenQuerySet(OwnedQuerySet):
    def active(self, now: datetime | None = None) -> Self:
        now = now or timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=now)
        )
