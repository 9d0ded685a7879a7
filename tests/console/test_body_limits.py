"""Request bodies are capped by route before Django reads them (issue 29: a 300 MB chunked POST to
the sign-in page, anonymous, was received whole into a temporary file before any check).

The console's ASGI chain as ``console.asgi`` builds it for HTTP (``RequestBodyLimit`` around the
console's Django handler), called with real ASGI messages: a chunked body is a stream of
``http.request`` messages with ``more_body``, produced lazily so the test counts how much of it the
console ever asked for. tests/console/test_server_hardening.py sends the same over a socket to the
real server process.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from django.conf import settings

from console.api.handler import ConsoleASGIHandler
from console.bodylimit import RequestBodyLimit, limit_for

CHUNK = 64 * 1024
MB = 1024 * 1024

pytestmark = pytest.mark.django_db(transaction=True)


class Client:
    """Sends one request through the ASGI app; counts the body bytes the app asked for."""

    def __init__(self, total: int, *, declared: bool = False) -> None:
        self.total = total
        self.declared = declared
        self.sent = 0
        self.messages: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if self.sent >= self.total:
            await asyncio.sleep(3600)  # the client is still there, sending nothing more
        size = min(CHUNK, self.total - self.sent)
        self.sent += size
        return {"type": "http.request", "body": b"x" * size, "more_body": self.sent < self.total}

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    def run(
        self,
        path: str,
        headers: list[tuple[bytes, bytes]] | None = None,
        *,
        host: str = "testserver",
        wrap: Any = None,
    ) -> tuple[int, dict, bytes]:
        app: Any = RequestBodyLimit(ConsoleASGIHandler())
        if wrap is not None:
            app = wrap(app)
        heads = [(b"host", host.encode()), *(headers or [])]
        if self.declared:
            heads.append((b"content-length", str(self.total).encode()))
        else:
            heads.append((b"transfer-encoding", b"chunked"))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": heads,
            "client": ("127.0.0.1", 40000),
            "server": (host, 80),
        }
        asyncio.run(asyncio.wait_for(app(scope, self.receive, self.send), 60))
        start = next(m for m in self.messages if m["type"] == "http.response.start")
        body = b"".join(
            m.get("body", b"") for m in self.messages if m["type"] == "http.response.body"
        )
        return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def test_an_anonymous_chunked_300_mb_post_to_sign_in_is_refused_after_its_limit() -> None:
    client = Client(300 * MB)
    status, headers, body = client.run("/accounts/login/", [(b"accept-language", b"en")])
    assert status == 413
    limit = settings.REQUEST_BODY_ANONYMOUS_MAX_BYTES
    assert client.sent <= limit + CHUNK  # it stopped reading at the limit, not at 300 MB
    assert headers["content-type"].startswith("text/html")
    assert f"larger than {limit} bytes" in body.decode()


def test_a_declared_length_over_the_limit_is_refused_before_a_byte_is_read() -> None:
    client = Client(300 * MB, declared=True)
    status, _headers, body = client.run("/accounts/login/")
    assert status == 413 and client.sent == 0
    assert "请求" in body.decode()  # zh-hans, the default language


def test_an_api_body_over_its_limit_gets_the_json_error_body() -> None:
    client = Client(4 * MB)
    status, headers, body = client.run("/api/v1/ssh-keys/", [(b"accept-language", b"en")])
    assert status == 413
    assert headers["content-type"] == "application/json"
    answer = json.loads(body)
    assert answer["error"] == "too_large"
    assert answer["limit"] == settings.REQUEST_BODY_MAX_BYTES
    assert str(settings.REQUEST_BODY_MAX_BYTES) in answer["detail"]
    assert client.sent <= settings.REQUEST_BODY_MAX_BYTES + CHUNK


@pytest.mark.parametrize(
    ("path", "host"),
    [
        ("/storage/pfs/upload/", "testserver"),
        ("/apps/0b4f3a9e-5d4c-4a3b-9c2d-1e0f9a8b7c6d/v1/images/edits", "testserver"),
        ("/upload", "0b4f3a9e-5d4c-4a3b-9c2d-1e0f9a8b7c6d-8080.localhost"),  # an app host
    ],
)
def test_upload_and_proxy_routes_take_bodies_past_the_forms_limit(path: str, host: str) -> None:
    """3 MB, over the forms' and the API's limit: these routes receive it whole (anonymous, the
    answer is then the view's own: a sign-in redirect or 404, never the 413)."""
    from slices.port_views import AppHostRouter

    client = Client(3 * MB)
    status, _headers, _body = client.run(path, host=host, wrap=AppHostRouter)
    assert status != 413
    assert client.sent == 3 * MB


def test_the_consoles_own_port_routes_take_no_big_body() -> None:
    """The console's host only redirects from a port's route (issue 29): the forms' limit."""
    client = Client(3 * MB)
    status, _headers, _body = client.run(f"/instances/{uuid.uuid4()}/ports/8080/upload")
    assert status == 413


def test_the_route_table() -> None:
    assert limit_for("/accounts/login/") == settings.REQUEST_BODY_ANONYMOUS_MAX_BYTES
    assert limit_for("/accounts/signup/") == settings.REQUEST_BODY_ANONYMOUS_MAX_BYTES
    assert limit_for("/accounts/password/reset/") == settings.REQUEST_BODY_ANONYMOUS_MAX_BYTES
    assert limit_for("/accounts/ssh-keys/") == settings.REQUEST_BODY_MAX_BYTES
    assert limit_for("/api/v1/instances/") == settings.REQUEST_BODY_MAX_BYTES
    assert limit_for("/storage/pfs/upload/") > settings.SLICES_PFS_UPLOAD_MAX_BYTES
    assert limit_for("/storage/pfs/mkdir/") == settings.REQUEST_BODY_MAX_BYTES
    app_api = f"/apps/{uuid.uuid4()}/v1/images/edits"
    assert limit_for(app_api) == settings.PORT_PROXY_BODY_MAX_BYTES
