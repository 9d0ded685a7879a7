from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination


class ConsolePagination(LimitOffsetPagination):
    """``?limit=&offset=`` with a ceiling: one request never asks for an unbounded page."""

    default_limit = 50
    max_limit = 200
