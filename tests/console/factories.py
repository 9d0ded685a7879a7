"""Factories for the console: users (the personas in tests/conftest.py are built on them) and the
accounts glue, with real key material and real tokens through the services."""

from __future__ import annotations

import uuid
from datetime import date, datetime, timedelta

import factory
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from django.utils import timezone

from console import services
from console.models import ApiToken, SshKey, User
from console.verification.checks import mask_id_number, resident_id_check_char
from console.verification.models import Verification, VerificationKind, VerificationState
from console.verification.services import id_number_hash

PASSWORD = "correct-horse-battery-9"

_OPENSSH = (serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)


class UserFactory(factory.django.DjangoModelFactory):
    """A customer who can log in with ``PASSWORD``; ``UserFactory(username="alice")``."""

    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"customer{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.django.Password(PASSWORD)

    @factory.post_generation
    def verified(obj: User, create: bool, extracted: bool | None, **kwargs: object) -> None:
        """Customers are verified (实名认证, as the sandbox approves them) unless made with
        ``verified=False``: the gate (VERIFICATION_REQUIRED_FOR) stays on in every test."""
        if create and extracted is not False:
            verify_personally(obj)


def resident_id(serial: int) -> str:
    """A valid resident ID number (GB 11643 check character), one per ``serial``."""
    born = date(1949, 1, 1) + timedelta(days=serial % 20000)
    first17 = f"110105{born:%Y%m%d}{serial // 20000 % 1000:03d}"
    return first17 + resident_id_check_char(first17)


def verify_personally(user: User) -> Verification:
    """An approved personal verification, as the sandbox provider records it (no mail sent);
    each user's own ID number (one number verifies one account)."""
    number = resident_id(user.pk)
    return Verification.objects.create(
        owner=user,
        kind=VerificationKind.PERSONAL,
        state=VerificationState.APPROVED,
        provider="sandbox",
        real_name=user.first_name or user.username,
        id_number_masked=mask_id_number(number),
        id_number_hash=id_number_hash(number),
        decided_at=timezone.now(),
    )


def ed25519_public_key(comment: str = "me@laptop") -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    return f"{key.public_bytes(*_OPENSSH).decode()} {comment}".strip()


def ecdsa_public_key(curve: ec.EllipticCurve, comment: str = "me@laptop") -> str:
    key = ec.generate_private_key(curve).public_key()
    return f"{key.public_bytes(*_OPENSSH).decode()} {comment}".strip()


def rsa_public_key(bits: int = 2048, comment: str = "me@laptop") -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits).public_key()
    return f"{key.public_bytes(*_OPENSSH).decode()} {comment}".strip()


def padded_rsa_key(line: str, zeros: int = 1) -> str:
    """The same RSA key re-encoded with ``zeros`` extra zero bytes before its exponent and modulus
    (OpenSSH reads both as the same numbers: one key, a second encoding)."""
    import base64
    import struct

    parts = line.split()
    blob = base64.b64decode(parts[1])
    fields = []
    while blob:
        (length,) = struct.unpack(">I", blob[:4])
        fields.append(blob[4 : 4 + length])
        blob = blob[4 + length :]
    kind, exponent, modulus = fields
    padded = [kind, b"\0" * zeros + exponent, b"\0" * zeros + modulus]
    new = base64.b64encode(b"".join(struct.pack(">I", len(f)) + f for f in padded)).decode()
    return " ".join([parts[0], new, *parts[2:]])


def make_ssh_key(owner: User, name: str = "", **kwargs: object) -> SshKey:
    name = name or f"key-{uuid.uuid4().hex[:8]}"
    return services.add_ssh_key(owner, name=name, public_key=ed25519_public_key(), **kwargs)


def make_api_token(
    owner: User, name: str = "ci", expires_at: datetime | None = None
) -> tuple[ApiToken, str]:
    return services.create_api_token(owner, name=name, expires_at=expires_at)
