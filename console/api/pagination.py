from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils.translation import gettext_noop
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

from console.errors import DomainError

# No list is a billion rows long; a larger offset (2**63 overflowed the database's integer: a
# 500 on every list, issue 29) is a 400 naming the field, like a typo in it.
MAX_OFFSET = 1_000_000_000
_DIGITS = frozenset("0123456789")


def query_int(request: Request, name: str, *, low: int, high: int | None) -> int | None:
    """The query parameter ``name`` as a whole number in ``[low, high]`` (None when absent), or
    a ``DomainError`` naming it: plain ASCII digits only (no sign, space, "1e3" or "٣")."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    value = int(raw) if len(raw) <= 100 and set(raw) <= _DIGITS else None
    if value is None or value < low or (high is not None and value > high):
        if high is None:
            raise DomainError(
                gettext_noop("%(name)s must be a whole number of at least %(low)s."),
                field=name,
                name=name,
                low=low,
            )
        raise DomainError(
            gettext_noop("%(name)s must be a whole number from %(low)s to %(high)s."),
            field=name,
            name=name,
            low=low,
            high=high,
        )
    return value


class ConsolePagination(LimitOffsetPagination):
    """``?limit=&offset=`` with a ceiling: one request never asks for an unbounded page.

    The page is read first and counted only when it cannot say the count itself (a full page, or
    an empty one past the start): a list that fits one page, what a client polling its few
    instances gets, costs one query rather than two. The answer is DRF's, ``count`` included.
    """

    default_limit = 50
    max_limit = 200

    def get_limit(self, request: Request) -> int:
        """``?limit=`` from 1 on; above ``max_limit`` the page is ``max_limit`` long (DRF's
        rule); anything that is not a whole number of at least 1 is a 400 naming ``limit``."""
        limit = query_int(request, self.limit_query_param, low=1, high=None)
        return self.default_limit if limit is None else min(limit, self.max_limit)

    def get_offset(self, request: Request) -> int:
        """``?offset=`` from 0 to ``MAX_OFFSET``, or a 400 naming ``offset``."""
        offset = query_int(request, self.offset_query_param, low=0, high=MAX_OFFSET)
        return offset or 0

    def paginate_queryset(
        self, queryset: Any, request: Request, view: Any = None
    ) -> list[Any] | None:
        return self.paginate(
            request,
            lambda offset, limit: list(queryset[offset : offset + limit]),
            lambda: self.get_count(queryset),
        )

    def paginate(
        self,
        request: Request,
        rows: Callable[[int, int], list[Any]],
        count: Callable[[], int],
    ) -> list[Any]:
        """The page ``rows(offset, limit)`` reads, with ``self.count`` set (``count()`` asked
        only when the page does not tell it)."""
        self.request = request
        self.limit = self.get_limit(request)  # never None: default_limit is set
        self.offset = self.get_offset(request)
        page = rows(self.offset, self.limit)
        if 0 < len(page) < self.limit or (not page and self.offset == 0):
            self.count = self.offset + len(page)
        else:
            self.count = count()
        if self.count > self.limit and self.template is not None:
            self.display_page_controls = True
        return page
