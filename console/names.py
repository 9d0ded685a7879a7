"""The one set of rules for a name a customer chooses: instances, disks, SSH keys, API tokens.

Names show in lists, logs, e-mails, terminals and on the node (an instance's name). A name with
``\\x1b[31m`` recolours a terminal, U+202E reverses what follows ("gpj.exe"), and a name of
zero-width spaces looks empty or like another one; every place a customer names a thing calls
:func:`clean_name`, so a character refused in one is refused in all, from a form or the API.

The rules, in order:

- NFC-normalised: the composed and decomposed spellings of "é" are one name (a duplicate check
  cannot be passed with the other spelling; nothing visible changes, unlike NFKC);
- trimmed of surrounding whitespace (an empty result is for the caller to default or refuse);
- no control, format, surrogate, private-use or unassigned characters, nor line/paragraph
  separators (Unicode categories Cc, Cf, Cs, Co, Cn, Zl, Zp): newlines, ESC, NUL, U+200B/U+200D
  zero-width characters, U+202E and the other bidi controls, U+FEFF;
- at most ``max_length`` characters after the above (the column's length; 63 unless told).

Every script, ordinary spaces (also U+3000) and emoji are fine.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from django.utils.translation import gettext_noop

from console.errors import DomainError, ErrorCode

NAME_MAX_LENGTH = 63

# Invisible, or act on the text around them (see the module docstring).
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


class NameRefused(DomainError):  # noqa: N818 - reads as a domain event: "name refused"
    """A chosen name breaks a rule; ``reason`` is ``hidden_characters`` or ``too_long``."""

    code = ErrorCode.INVALID
    http_status = 400

    def __init__(self, template: str, /, *, reason: str, field: str, **params: Any) -> None:
        super().__init__(template, field=field, **params)
        self.reason = reason


def clean_name(value: str | None, *, max_length: int = NAME_MAX_LENGTH, field: str = "name") -> str:
    """The name as stored (NFC, trimmed; "" when blank), or :class:`NameRefused` saying why.

    ``field`` is the request field the refusal names (``fields`` in the API's error body).
    """
    text = unicodedata.normalize("NFC", value or "").strip()
    for char in text:
        if unicodedata.category(char) in HIDDEN_CATEGORIES:
            raise NameRefused(
                gettext_noop(
                    "Names may not contain control or invisible characters (found %(char)s). "
                    "Use letters, digits, spaces and punctuation."
                ),
                reason="hidden_characters",
                field=field,
                char=f"U+{ord(char):04X}",
            )
    if len(text) > max_length:
        raise NameRefused(
            gettext_noop("A name has at most %(max)d characters (this one has %(length)d)."),
            reason="too_long",
            field=field,
            max=max_length,
            length=len(text),
        )
    return text


__all__ = ["HIDDEN_CATEGORIES", "NAME_MAX_LENGTH", "NameRefused", "clean_name"]
