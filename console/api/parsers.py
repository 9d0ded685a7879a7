"""Request parsers for the whole API (``REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]``)."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class SafeJSONParser(JSONParser):
    """DRF's JSON parser, with nesting too deep for Python's parser answered as a 400.

    ``json.loads`` raises ``RecursionError`` (not ``ValueError``) for input such as
    ``{"a":{"a":…}}`` nested a thousand deep; DRF's parser lets it through as a 500.
    """

    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: dict[str, Any] | None = None,
    ) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(_("JSON parse error: the document is nested too deeply.")) from None
