"""SMS backends (``SMS_BACKEND``): ``send(phone, text)``. The embedded default writes each message
to a file under ``SMS_FILE_PATH`` (``var/sms/``), as the mail backend does with ``var/mail/``; a
provider's backend (Aliyun, Tencent Cloud) implements the same method."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from django.conf import settings
from django.utils.module_loading import import_string


class SmsBackend(Protocol):
    def send(self, phone: str, text: str) -> None: ...


class FileBackend:
    """One file per message: ``To:`` and the text."""

    def send(self, phone: str, text: str) -> None:
        folder = Path(settings.SMS_FILE_PATH)
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(4)}.txt"
        (folder / name).write_text(f"To: {phone}\n\n{text}\n", encoding="utf-8")


class LocmemBackend:
    """Keeps messages in ``outbox`` (tests)."""

    outbox: list[tuple[str, str]] = []

    def send(self, phone: str, text: str) -> None:
        LocmemBackend.outbox.append((phone, text))


def get_backend() -> SmsBackend:
    backend: SmsBackend = import_string(settings.SMS_BACKEND)()
    return backend
