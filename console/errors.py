"""One error vocabulary for every app: a code from ``ErrorCode``, an HTTP status and parameters.

Services raise a :class:`DomainError` subclass with a message *template* (marked for translation
with ``gettext_noop``) and its parameters; nothing is translated at raise time. Where the error is
shown, ``message()`` renders the template in the reader's language (the API's exception handler,
a page's flash message, a template's ``{{ error.message }}``). The API body is
``{"error": code, "detail": message, **params}`` with ``http_status`` (console/api/exceptions.py).
"""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum
from typing import Any

from django.utils.translation import gettext


class ErrorCode(StrEnum):
    INVALID = "invalid"
    NOT_AUTHENTICATED = "not_authenticated"
    PERMISSION_DENIED = "permission_denied"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    THROTTLED = "throttled"
    CONFLICT = "conflict"
    NO_CAPACITY = "no_capacity"
    INSUFFICIENT_FUNDS = "insufficient_funds"
    IDEMPOTENCY_MISMATCH = "idempotency_key_reused"
    IN_PROGRESS = "request_in_progress"
    INVALID_SIGNATURE = "invalid_signature"
    # Payment callbacks: why one was refused (the provider's logs and our tests tell them apart).
    MISSING_SIGNATURE = "missing_signature"
    BAD_SIGNATURE = "bad_signature"
    STALE_SIGNATURE = "stale_signature"  # outside the replay window
    MALFORMED_BODY = "malformed_body"
    INVALID_AMOUNT = "invalid_amount"
    UNKNOWN_STATUS = "unknown_status"
    UNKNOWN_PAYMENT = "unknown_payment"
    AMOUNT_MISMATCH = "amount_mismatch"
    TRANSACTION_REUSED = "transaction_reused"
    UNKNOWN_ASSET = "unknown_asset"
    LICENSE_NOT_ACCEPTED = "license_not_accepted"
    INVALID_MOUNT = "invalid_mount"
    QUOTA_EXCEEDED = "quota_exceeded"
    BUDGET_EXCEEDED = "budget_exceeded"  # a member's monthly budget (402, issue 30)
    PRICE_NOT_SET = "price_not_set"
    TOO_LARGE = "too_large"  # a request body over DATA_UPLOAD_MAX_MEMORY_SIZE (413)
    VERIFICATION_REQUIRED = "verification_required"  # 实名认证 first (403)
    UNAVAILABLE = "unavailable"  # a transient outage (database, Redis): 503 with Retry-After
    ERROR = "error"


class DomainError(Exception):
    """An expected refusal of a domain action (not a bug): what went wrong as a code + parameters.

    ``template`` is an untranslated message with ``%(name)s`` placeholders filled from ``params``;
    subclasses set ``code`` and ``http_status`` (an instance may override both). ``field`` names
    the request field at fault (``image``, ``ssh_key``, ``disks``): the body then carries
    ``fields: {field: [message]}`` like a serializer's field error, so a client handles both alike.
    """

    code: ErrorCode = ErrorCode.INVALID
    http_status: int = 400
    field: str | None = None

    def __init__(
        self,
        template: str,
        /,
        *,
        code: ErrorCode | None = None,
        http_status: int | None = None,
        field: str | None = None,
        **params: Any,
    ) -> None:
        super().__init__(template)
        self.template = template
        self.params: dict[str, Any] = params
        if code is not None:
            self.code = code
        if http_status is not None:
            self.http_status = http_status
        if field is not None:
            self.field = field

    def message(self) -> str:
        """The message in the active language (translated now, not when the error was raised)."""
        text = gettext(self.template)
        return text % self.params if self.params else text

    def __str__(self) -> str:
        return self.message()

    def as_body(self) -> dict[str, Any]:
        """The JSON error body: ``{"error": code, "detail": message, **params}``, plus
        ``fields`` when the error is about one request field."""
        params = {k: str(v) if isinstance(v, Decimal) else v for k, v in self.params.items()}
        body = {**params, "error": str(self.code), "detail": self.message()}
        if self.field:
            body["fields"] = {self.field: [body["detail"]]}
        return body
