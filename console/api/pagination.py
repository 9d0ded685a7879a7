from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request


class ConsolePagination(LimitOffsetPagination):
    """``?limit=&offset=`` with a ceiling: one request never asks for an unbounded page.

    The page is read first and counted only when it cannot say the count itself (a full page, or
    an empty one past the start): a list that fits one page, what a client polling its few
    instances gets, costs one query rather than two. The answer is DRF's, ``count`` included.
    """

    default_limit = 50
    max_limit = 200

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
