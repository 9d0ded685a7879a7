"""Check digits of Chinese identity numbers, and how an ID number is kept (pure: no Django).

* ``resident_id_valid``: the 18-character citizen identity number of GB 11643-1999: 17 digits
  (region, date of birth, sequence) and an ISO 7064 MOD 11-2 check character (``0``-``9`` or ``X``).
* ``credit_code_valid``: the 18-character unified social credit code of GB 32100-2015: characters
  from a 31-letter alphabet (no I, O, S, V, Z) and a MOD 31 check character.
* ``mask_id_number``: what is shown and stored of an ID number (its first and last two characters).
"""

from __future__ import annotations

from datetime import date

_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"  # indexed by the weighted sum mod 11

CREDIT_CODE_ALPHABET = "0123456789ABCDEFGHJKLMNPQRTUWXY"
_CREDIT_WEIGHTS = (1, 3, 9, 27, 19, 26, 16, 17, 20, 29, 25, 13, 8, 24, 10, 30, 28)


def normalize(value: str) -> str:
    """Upper case, without spaces (people type ``x`` for ``X`` and group digits)."""
    return "".join(value.split()).upper()


def resident_id_check_char(first17: str) -> str:
    """The GB 11643 check character of the first 17 digits."""
    total = sum(int(c) * w for c, w in zip(first17, _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11]


def resident_id_valid(value: str, *, today: date | None = None) -> bool:
    """An 18-character resident ID number: 17 digits, a real date of birth not in the future,
    and the right check character."""
    number = normalize(value)
    if len(number) != 18 or not number[:17].isdigit():
        return False
    try:
        born = date(int(number[6:10]), int(number[10:12]), int(number[12:14]))
    except ValueError:
        return False
    if born.year < 1900 or born > (today or date.today()):
        return False
    return number[17] == resident_id_check_char(number[:17])


def credit_code_check_char(first17: str) -> str:
    """The GB 32100 check character of the first 17 characters."""
    total = sum(
        CREDIT_CODE_ALPHABET.index(c) * w for c, w in zip(first17, _CREDIT_WEIGHTS, strict=True)
    )
    return CREDIT_CODE_ALPHABET[(31 - total % 31) % 31]


def credit_code_valid(value: str) -> bool:
    """An 18-character unified social credit code with the right check character."""
    code = normalize(value)
    if len(code) != 18 or any(c not in CREDIT_CODE_ALPHABET for c in code):
        return False
    return code[17] == credit_code_check_char(code[:17])


def mask_id_number(value: str) -> str:
    """The ID number as kept and shown: the first two and last two characters (the province and
    the check character), every other one a ``*``."""
    number = normalize(value)
    return number[:2] + "*" * (len(number) - 4) + number[-2:]
