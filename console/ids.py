"""Public ids in URLs and forms: the one UUID pattern the API routers match, and parsing a UUID
that came from a request (anything malformed is "no such object", never a server error)."""

from __future__ import annotations

import uuid
from typing import Any

from django.http import Http404

# What a router's lookup_value_regex accepts: with or without dashes (32 or 36 characters).
UUID_PATTERN = "[0-9a-fA-F-]{32,36}"


def parse_uuid(value: Any) -> uuid.UUID | None:
    """``value`` as a UUID (a UUID is returned as it is), or None if it is not one."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except (TypeError, ValueError, AttributeError):
        return None


def uuid_or_404(value: Any) -> uuid.UUID:
    """``value`` as a UUID, or ``Http404`` (a malformed id names nothing)."""
    parsed = parse_uuid(value)
    if parsed is None:
        raise Http404
    return parsed
