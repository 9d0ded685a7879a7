"""Shared assertions for the API's error bodies (NetBox's ``utilities/testing/api.py`` is the
model): every refusal answers ``{"error": code, "detail": message, ...}``, with ``fields`` naming
the request field at fault, in the request's language, and JSON."""

from __future__ import annotations

from typing import Any


def assert_error(
    response: Any,
    status: int,
    error: str,
    *,
    field: str | None = None,
    detail: str | None = None,
) -> dict[str, Any]:
    """Assert ``response`` is the API's error body; return it for further checks.

    ``detail``: a part of the message the client reads (in the language the request asked for).
    ``field``: the request field the error is about (``fields: {field: [message, ...]}``).
    """
    assert response.status_code == status, (response.status_code, _body(response))
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = _body(response)
    assert body.get("error") == error, body
    assert isinstance(body.get("detail"), str) and body["detail"], body
    if detail is not None:
        assert detail in body["detail"], body
    if field is not None:
        fields = body.get("fields") or {}
        assert field in fields and all(isinstance(m, str) and m for m in fields[field]), body
    return body


def _body(response: Any) -> dict[str, Any]:
    data = response.json()
    assert isinstance(data, dict), data
    return data
