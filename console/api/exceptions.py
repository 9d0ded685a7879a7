"""One error body for the whole API: ``{"error": "<code>", "detail": "<message>"}``."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from rest_framework import status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler


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
    ERROR = "error"


class ApiError(APIException):
    """Raise from API views/services with a code from ``ErrorCode`` and a human message."""

    def __init__(
        self,
        code: ErrorCode | str,
        detail: str,
        status_code: int = status.HTTP_400_BAD_REQUEST,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail=detail, code=str(code))
        self.status_code = status_code
        self.error_code = str(code)
        self.extra = extra or {}


_STATUS_CODES = {
    400: ErrorCode.INVALID,
    401: ErrorCode.NOT_AUTHENTICATED,
    403: ErrorCode.PERMISSION_DENIED,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    409: ErrorCode.CONFLICT,
    429: ErrorCode.THROTTLED,
}


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, ApiError):
        body: dict[str, Any] = {"error": exc.error_code, "detail": str(exc.detail), **exc.extra}
    elif isinstance(exc, ValidationError):
        body = {"error": ErrorCode.INVALID, "detail": _flatten(exc.detail), "fields": exc.detail}
    else:
        code = _STATUS_CODES.get(response.status_code, ErrorCode.ERROR)
        detail = response.data.get("detail", "") if isinstance(response.data, dict) else ""
        body = {"error": str(code), "detail": str(detail)}
    response.data = body
    return response


def _flatten(detail: Any) -> str:
    """A one-line message from DRF's nested validation errors, for humans and logs."""
    if isinstance(detail, dict):
        return "; ".join(f"{k}: {_flatten(v)}" for k, v in detail.items())
    if isinstance(detail, list):
        return " ".join(_flatten(v) for v in detail)
    return str(detail)
