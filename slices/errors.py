"""The slices app's refusals, in the one error vocabulary (console.errors.DomainError)."""

from __future__ import annotations

from django.utils.translation import gettext_noop

from console.errors import DomainError, ErrorCode


class OrderRefused(DomainError):
    """An order that cannot be accepted as given (nothing was reserved or charged)."""

    code = ErrorCode.INVALID
    http_status = 400


class QuotaExceeded(DomainError):
    code = ErrorCode.QUOTA_EXCEEDED
    http_status = 409


class InstanceConflict(DomainError):
    """The instance is not in a state that allows this action."""

    code = ErrorCode.CONFLICT
    http_status = 409


def quota_exceeded(limit: int, used: int, cards: int) -> QuotaExceeded:
    return QuotaExceeded(
        gettext_noop(
            "Your account may hold %(limit)d cards at once; %(used)d are in use, so %(cards)d "
            "more would exceed it. Release an instance or ask us to raise the quota."
        ),
        limit=limit,
        used=used,
        cards=cards,
    )


def member_quota_exceeded(quota: int, held: int, cards: int) -> QuotaExceeded:
    """A member's own card quota in the team (issue 30), set by its owner, admin or billing."""
    return QuotaExceeded(
        gettext_noop(
            "Your card quota in this team is %(quota)d; you hold %(held)d, so %(cards)d more "
            "would exceed it. Release an instance or ask a team owner or admin to raise it."
        ),
        quota=quota,
        held=held,
        cards=cards,
    )
