"""Translated messages for refused input (SSH keys, email domains)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext_lazy

from console.names import NameRefused, clean_name
from console.sshkeys import MIN_RSA_BITS, PublicKey, SshKeyError, parse_public_key

SSH_KEY_MESSAGES = {
    "empty": _("Paste your public key, e.g. the contents of ~/.ssh/id_ed25519.pub."),
    "too_long": _("This is too long to be an SSH public key."),
    "private_key": _(
        "This is a PRIVATE key. Never share it: paste the public key (the .pub file) instead."
    ),
    "rfc4716": _(
        "This key is in SSH2 (RFC 4716) format; convert it with `ssh-keygen -i -f key.pub` "
        "and paste the one-line OpenSSH form."
    ),
    "multiple_lines": _("Paste exactly one key, on one line."),
    "multiple_keys": _(
        "This line holds more than one key. Paste exactly one key; add the others one by one."
    ),
    "unsupported_type": _(
        "Key type %(key_type)s is not supported. Use ssh-ed25519, ecdsa-sha2-nistp256/384/521 "
        "or ssh-rsa (at least 2048 bits)."
    ),
    "malformed": _(
        "This is not a valid OpenSSH public key. It should look like "
        "“ssh-ed25519 AAAAC3Nza… you@laptop”."
    ),
    "type_mismatch": _("The key's type does not match its data: the key is corrupted."),
    "rsa_too_short": _(
        "This RSA key has only %(bits)s bits; at least %(minimum)s are required. "
        "Generate a new one with `ssh-keygen -t ed25519`."
    ),
    "comment_too_long": _("The key's comment is longer than %(limit)s characters."),
    "comment_characters": _("The key's comment may contain only printable ASCII characters."),
}


def parse_ssh_public_key(text: str) -> PublicKey:
    """Parse a pasted key or raise a ``ValidationError`` with a message saying what is wrong."""
    try:
        return parse_public_key(text)
    except SshKeyError as exc:
        raise ValidationError(
            SSH_KEY_MESSAGES[exc.code], code=f"ssh_key_{exc.code}", params=exc.params
        ) from None


# Keys' and tokens' names are stored in 100-character columns; the rules are console/names.py's.
DISPLAY_NAME_MAX_LENGTH = 100


def validate_display_name(value: str | None, max_length: int = DISPLAY_NAME_MAX_LENGTH) -> str:
    """A name people choose (SSH keys, API tokens), cleaned by the rules every name follows
    (``console.names.clean_name``: NFC, trimmed, no control or invisible characters, a length).

    Returns the name to store ("" when blank); raises a ``ValidationError`` naming the character
    or the limit.
    """
    try:
        return clean_name(value, max_length=max_length)
    except NameRefused as exc:
        raise ValidationError(exc.message(), code=exc.reason) from None


def _blocked_domains() -> frozenset[str]:
    from disposable_email_domains import blocklist

    extra = {d.strip().lower() for d in settings.DISPOSABLE_EMAIL_DOMAINS if d.strip()}
    return frozenset(blocklist) | extra


def is_disposable_email(email: str) -> bool:
    """True for throw-away mailbox providers, including their subdomains (x.mailinator.com)."""
    domain = email.rpartition("@")[2].strip().lower().rstrip(".")
    if not domain:
        return False
    blocked = _blocked_domains()
    labels = domain.split(".")
    return any(".".join(labels[i:]) in blocked for i in range(len(labels) - 1))


def validate_not_disposable(email: str) -> None:
    if is_disposable_email(email):
        raise ValidationError(
            _(
                "Disposable email addresses (%(domain)s) cannot be used. Please sign up with "
                "an address you will keep: it is where bills and security notices go."
            ),
            code="disposable_email",
            params={"domain": email.rpartition("@")[2].lower()},
        )


# Django 5.2 changed this validator message's msgid (%(min_length)d -> %d) and its zh-hans
# catalogue still carries only the old one; repeating it here puts a translation into ours.
_DJANGO_CATALOGUE_GAPS = (
    ngettext_lazy(
        "This password is too short. It must contain at least %d character.",
        "This password is too short. It must contain at least %d characters.",
        10,
    ),
)

__all__ = [
    "MIN_RSA_BITS",
    "is_disposable_email",
    "parse_ssh_public_key",
    "validate_display_name",
    "validate_not_disposable",
]
