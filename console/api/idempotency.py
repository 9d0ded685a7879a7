"""The ``Idempotency-Key`` header of calls that spend money or allocate GPUs."""

from __future__ import annotations

from django.utils.translation import gettext_noop
from rest_framework.request import Request

from console.errors import DomainError


def idempotency_key(request: Request, max_length: int) -> str | None:
    """The request's key, stripped, or None without one.

    A key longer than the column that stores it is refused (400): truncating would make two
    different keys collide.
    """
    key = (request.headers.get("Idempotency-Key") or "").strip() or None
    if key is not None and len(key) > max_length:
        raise DomainError(
            gettext_noop("The Idempotency-Key is longer than %(max)d characters."),
            field="Idempotency-Key",
            max=max_length,
        )
    return key
