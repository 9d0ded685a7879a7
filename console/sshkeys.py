"""Parse and check OpenSSH public keys (one ``authorized_keys`` line). No Django in here.

A key is accepted only if its wire-format blob parses completely, its algorithm is on the allow-list,
RSA moduli have at least 2048 bits and elliptic-curve points lie on their curve. The canonical form
we store and later write into ``authorized_keys`` on the nodes is ``<type> <base64>`` plus a comment
restricted to printable characters, so nothing a user pastes can add a second line or options.

The stored blob is re-encoded canonically (issue 29): RSA's exponent and modulus as minimal
``mpint``s, an ECDSA point uncompressed. OpenSSH reads ``00 00 … n`` as the same modulus as ``n``
(and ``ssh-keygen -l`` prints one fingerprint for both), so two encodings of one key must become
one stored key with one fingerprint: uniqueness is decided by that fingerprint.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass

ED25519 = "ssh-ed25519"
RSA = "ssh-rsa"
ECDSA_CURVES = {
    "ecdsa-sha2-nistp256": ("nistp256", 256),
    "ecdsa-sha2-nistp384": ("nistp384", 384),
    "ecdsa-sha2-nistp521": ("nistp521", 521),
}
ALLOWED_TYPES = (ED25519, *ECDSA_CURVES, RSA)
MIN_RSA_BITS = 2048
MAX_RSA_BITS = 16384
MAX_TEXT_LENGTH = 8192
MAX_COMMENT_LENGTH = 255
_COMMENT_OK = re.compile(r"^[\x20-\x7e]*$")  # printable ASCII: no control characters, no newlines
# A key's base64 blob (every OpenSSH key blob starts with a length prefix: "AAAA…").
_KEY_BLOB = re.compile(r"^AAAA[A-Za-z0-9+/]{40,}={0,2}$")


class SshKeyError(ValueError):
    """A pasted key was refused; ``code`` says why (the UI maps it to a translated message)."""

    def __init__(self, code: str, **params: object) -> None:
        super().__init__(code)
        self.code = code
        self.params = params


@dataclass(frozen=True)
class PublicKey:
    key_type: str
    blob: bytes
    bits: int
    comment: str

    @property
    def base64(self) -> str:
        return base64.b64encode(self.blob).decode("ascii")

    @property
    def openssh(self) -> str:
        """``<type> <base64>``: the key without its comment (what identifies it)."""
        return f"{self.key_type} {self.base64}"

    @property
    def authorized_keys_line(self) -> str:
        return f"{self.openssh} {self.comment}".rstrip()

    @property
    def fingerprint(self) -> str:
        """OpenSSH's SHA256 fingerprint, as ``ssh-keygen -lf`` prints it."""
        digest = hashlib.sha256(self.blob).digest()
        return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def string(self) -> bytes:
        if self.pos + 4 > len(self.data):
            raise SshKeyError("malformed")
        (length,) = struct.unpack(">I", self.data[self.pos : self.pos + 4])
        self.pos += 4
        if length > len(self.data) - self.pos:
            raise SshKeyError("malformed")
        value = self.data[self.pos : self.pos + length]
        self.pos += length
        return value

    def mpint(self) -> int:
        raw = self.string()
        if raw and raw[0] & 0x80:
            raise SshKeyError("malformed")  # negative: never valid in a public key
        return int.from_bytes(raw, "big")  # leading zero bytes read as OpenSSH reads them

    def done(self) -> None:
        if self.pos != len(self.data):
            raise SshKeyError("malformed")


def _string(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def _mpint(value: int) -> bytes:
    """The minimal two's-complement encoding (RFC 4251 §5): no leading zero byte unless the high
    bit of the next one is set."""
    raw = value.to_bytes((value.bit_length() + 8) // 8, "big") if value else b""
    return _string(raw)


def parse_public_key(text: str) -> PublicKey:
    """Parse one OpenSSH public key line, or raise ``SshKeyError`` saying what is wrong."""
    text = (text or "").strip()
    if not text:
        raise SshKeyError("empty")
    if len(text) > MAX_TEXT_LENGTH:
        raise SshKeyError("too_long")
    if "PRIVATE KEY" in text:
        raise SshKeyError("private_key")
    if text.startswith("---- BEGIN SSH2 PUBLIC KEY"):
        raise SshKeyError("rfc4716")
    if "\n" in text or "\r" in text:
        raise SshKeyError("multiple_lines")
    parts = text.split(None, 2)
    key_type = parts[0]
    if key_type not in ALLOWED_TYPES:
        if key_type.startswith(("ssh-", "ecdsa-", "sk-")) or len(parts) >= 2:
            raise SshKeyError("unsupported_type", key_type=key_type[:40])
        raise SshKeyError("malformed")
    if len(parts) < 2:
        raise SshKeyError("malformed")
    try:
        blob = base64.b64decode(parts[1].encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise SshKeyError("malformed") from None
    comment = parts[2].strip() if len(parts) > 2 else ""
    if any(word in ALLOWED_TYPES or _KEY_BLOB.match(word) for word in comment.split()):
        # "ssh-ed25519 AAAA… ssh-ed25519 AAAA…": the second key would become the first one's
        # comment, and the user would believe both were installed.
        raise SshKeyError("multiple_keys")
    if len(comment) > MAX_COMMENT_LENGTH:
        raise SshKeyError("comment_too_long", limit=MAX_COMMENT_LENGTH)
    if not _COMMENT_OK.match(comment):
        raise SshKeyError("comment_characters")

    reader = _Reader(blob)
    if reader.string() != key_type.encode("ascii"):
        raise SshKeyError("type_mismatch")
    if key_type == ED25519:
        if len(reader.string()) != 32:
            raise SshKeyError("malformed")
        reader.done()
        bits = 256
    elif key_type == RSA:
        exponent = reader.mpint()
        modulus = reader.mpint()
        reader.done()
        bits = modulus.bit_length()
        if exponent < 3 or exponent % 2 == 0 or modulus % 2 == 0:
            raise SshKeyError("malformed")
        if bits < MIN_RSA_BITS:
            raise SshKeyError("rsa_too_short", bits=bits, minimum=MIN_RSA_BITS)
        if bits > MAX_RSA_BITS:
            raise SshKeyError("malformed")
        blob = _string(RSA.encode("ascii")) + _mpint(exponent) + _mpint(modulus)
    else:
        curve, bits = ECDSA_CURVES[key_type]
        if reader.string() != curve.encode("ascii"):
            raise SshKeyError("type_mismatch")
        point = reader.string()
        reader.done()
        point = _check_ec_point(key_type, point)
        blob = _string(key_type.encode("ascii")) + _string(curve.encode("ascii")) + _string(point)
    return PublicKey(key_type=key_type, blob=blob, bits=bits, comment=comment)


def canonical_openssh(text: str) -> tuple[str, str] | None:
    """``(<type> <base64>, fingerprint)`` of a key line in its canonical encoding, or None when
    it does not parse (what the gateway's keys file is rebuilt from)."""
    try:
        key = parse_public_key(text)
    except SshKeyError:
        return None
    return key.openssh, key.fingerprint


def _check_ec_point(key_type: str, point: bytes) -> bytes:
    """The point must be an uncompressed point on the named curve (checked by cryptography);
    returns its uncompressed encoding (OpenSSH reads no other)."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    curves = {
        "ecdsa-sha2-nistp256": ec.SECP256R1(),
        "ecdsa-sha2-nistp384": ec.SECP384R1(),
        "ecdsa-sha2-nistp521": ec.SECP521R1(),
    }
    if not point or point[0] != 0x04:
        raise SshKeyError("malformed")  # compressed: another encoding of a key, refused by sshd
    try:
        key = ec.EllipticCurvePublicKey.from_encoded_point(curves[key_type], point)
    except ValueError:
        raise SshKeyError("malformed") from None
    return key.public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
