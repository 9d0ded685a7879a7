"""One error body for the whole API: ``{"error": "<code>", "detail": "<message>"}``.

Every app's domain errors (``console.errors.DomainError`` subclasses: billing's, the marketplace's
``MountRefused``, slices') are mapped here, with their status and parameters, so views call services
without a try/except; Django's ``ValidationError`` from a service becomes DRF's 400 with its fields.
A transient error (the database or Redis cut, the connection pool exhausted: ``console.retries``)
is a 503 ``unavailable`` with ``Retry-After``, never a 500: the same request shortly succeeds.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import (
    RequestDataTooBig,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import JsonResponse
from django.utils.translation import gettext
from rest_framework import status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler, set_rollback

from console.errors import DomainError, ErrorCode
from console.retries import is_transient

__all__ = [
    "RETRY_AFTER_SECONDS",
    "TOO_LARGE",
    "ApiError",
    "ErrorCode",
    "api_exception_handler",
    "log_unavailable",
    "too_large_body",
    "unavailable_body",
    "unavailable_response",
]

logger = logging.getLogger(__name__)

# What a 503 asks a client to wait: long enough for the pool to free a connection or a restarted
# server to accept again, short enough that a client polling an order keeps up.
RETRY_AFTER_SECONDS = 5

# Django's request-size limits (DATA_UPLOAD_MAX_MEMORY_SIZE, _NUMBER_FIELDS, _NUMBER_FILES): raised
# where the body is first read, as a SuspiciousOperation that Django answers with its HTML 400.
TOO_LARGE = (RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent)


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
    413: ErrorCode.TOO_LARGE,
    429: ErrorCode.THROTTLED,
}


def too_large_body(exc: Exception) -> dict[str, Any]:
    """The JSON error body (413 ``too_large``) for a body over one of Django's upload limits;
    the console's ``handler400`` answers it too, for a body read before any API view runs."""
    if isinstance(exc, TooManyFieldsSent):
        limit, detail = (
            settings.DATA_UPLOAD_MAX_NUMBER_FIELDS,
            gettext("The request has more than %(limit)s fields."),
        )
    elif isinstance(exc, TooManyFilesSent):
        limit, detail = (
            settings.DATA_UPLOAD_MAX_NUMBER_FILES,
            gettext("The request has more than %(limit)s files."),
        )
    else:
        limit, detail = (
            settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
            gettext("The request body is larger than %(limit)s bytes."),
        )
    return {"error": str(ErrorCode.TOO_LARGE), "detail": detail % {"limit": limit}, "limit": limit}


def unavailable_body() -> dict[str, Any]:
    """The JSON error body of a 503 (a transient error): ``unavailable`` and the seconds to wait,
    also sent as ``Retry-After``; the console's ``handler500`` answers it for an API request
    whose error came from outside the API view (a middleware)."""
    return {
        "error": str(ErrorCode.UNAVAILABLE),
        "detail": gettext(
            "The service is briefly unavailable; please retry in %(seconds)s seconds."
        )
        % {"seconds": RETRY_AFTER_SECONDS},
        "retry_after": RETRY_AFTER_SECONDS,
    }


def unavailable_response() -> JsonResponse:
    """The API's 503 for a transient error met outside a DRF view (a middleware, or no API
    thread free): ``unavailable_body`` with ``Retry-After``."""
    response = JsonResponse(unavailable_body(), status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def log_unavailable(method: str, path: str, exc: BaseException) -> None:
    """One warning line per 503, no traceback: an outage would flood the log with them."""
    first = str(exc).strip().splitlines()
    logger.warning(
        "503 for %s %s: %s: %s", method, path, type(exc).__name__, first[0] if first else ""
    )


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if is_transient(exc):
        set_rollback()
        request = context.get("request")
        log_unavailable(getattr(request, "method", ""), getattr(request, "path", ""), exc)
        return Response(
            unavailable_body(),
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if isinstance(exc, TOO_LARGE):
        return Response(too_large_body(exc), status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, DomainError):
        set_rollback()
        return Response(exc.as_body(), status=exc.http_status)
    if isinstance(exc, DjangoValidationError):  # raised by a service's model validation
        exc = _drf_validation_error(exc)
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


def _drf_validation_error(exc: DjangoValidationError) -> ValidationError:
    if hasattr(exc, "error_dict"):
        return ValidationError(
            {k: [str(m) for e in v for m in e] for k, v in exc.error_dict.items()}
        )
    return ValidationError({"non_field_errors": [str(m) for m in exc]})


def _flatten(detail: Any) -> str:
    """A one-line message from DRF's nested validation errors, for humans and logs."""
    if isinstance(detail, dict):
        return "; ".join(f"{k}: {_flatten(v)}" for k, v in detail.items())
    if isinstance(detail, list):
        return " ".join(_flatten(v) for v in detail)
    return str(detail)
