"""console/api/handler.py: the console's ASGI handler serves an API request through the same
middleware and view as Django's own handler, in one thread hop, so every answer is the same:
status, body, and the headers the middleware adds (no-store for a signed-in caller, frame and
content-security policies, the language); pages keep Django's own handling."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid

import httpx
import pytest
from django.core.handlers.asgi import ASGIHandler

from console.api.handler import ConsoleASGIHandler
from tests.console.factories import make_api_token, make_ssh_key
from tests.support.servers import run_async

pytestmark = pytest.mark.django_db(transaction=True)

# Headers whose value differs on every answer (a fresh nonce, a new token's secret).
VARYING = {"content-security-policy", "content-length", "set-cookie", "expires"}


async def _exchange(app: ASGIHandler, requests: list[dict]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return [await client.request(**r) for r in requests]


def _comparable(response: httpx.Response) -> tuple:
    headers = {k: v for k, v in response.headers.items() if k not in VARYING}
    body = response.json() if "json" in response.headers.get("content-type", "") else None
    if isinstance(body, dict) and "token" in body:
        body = sorted(body)  # a new token each time: the same fields
    return response.status_code, body, headers, "content-security-policy" in response.headers


def test_api_and_page_answers_are_the_same_as_djangos_handler(alice) -> None:
    make_ssh_key(alice, name="laptop")
    _token, raw = make_api_token(alice)
    auth = {"Authorization": f"Token {raw}", "Accept-Language": "en"}
    requests = [
        {"method": "GET", "url": "/api/v1/ssh-keys/", "headers": auth},
        {"method": "GET", "url": "/api/v1/ssh-keys/", "headers": {"Authorization": "Token x"}},
        {
            "method": "POST",  # a token needs no CSRF token
            "url": "/api/v1/api-tokens/",
            "headers": {**auth, "Content-Type": "application/json"},
            "content": json.dumps({"name": "child"}),
        },
        {"method": "GET", "url": f"/api/v1/instances/{uuid.uuid4()}/", "headers": auth},
        {"method": "DELETE", "url": "/api/v1/billing/wallet/", "headers": auth},
        {"method": "GET", "url": "/api/v1/", "headers": {"Accept": "application/json"}},
        {"method": "GET", "url": "/accounts/login/", "headers": {"Accept-Language": "en"}},
    ]
    ours = run_async(_exchange(ConsoleASGIHandler(), requests))
    django = run_async(_exchange(ASGIHandler(), requests))

    assert [r.status_code for r in ours] == [200, 401, 201, 404, 405, 200, 200]
    for mine, theirs in zip(ours, django, strict=True):
        assert _comparable(mine) == _comparable(theirs), mine.request.url
    keys, refused, created = ours[0], ours[1], ours[2]
    assert [k["name"] for k in keys.json()["results"]] == ["laptop"]
    assert "no-store" in keys.headers["cache-control"]  # PrivatePagesMiddleware ran
    assert keys.headers["x-frame-options"] == "DENY" and keys.headers["content-language"] == "en"
    assert refused.json()["error"] == "not_authenticated"
    assert refused.headers["www-authenticate"] == "Token"
    assert created.json()["name"] == "child" and created.json()["token"].startswith("gct_")
    assert "<form" in ours[-1].text  # the page, through Django's own path


def test_api_requests_share_a_few_long_lived_threads(alice, settings) -> None:
    """API_THREADS threads serve every API request (none started per request, as Django's own
    handler does), two rounds of twelve at once."""
    from django.core import signals

    settings.API_THREADS = 2
    make_ssh_key(alice, name="laptop")
    _token, raw = make_api_token(alice)
    auth = {"Authorization": f"Token {raw}"}
    seen: list[str] = []

    def started(**kwargs) -> None:  # on the request's thread
        seen.append(threading.current_thread().name)

    async def concurrently(app: ConsoleASGIHandler) -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            return await asyncio.gather(
                *(c.get("/api/v1/ssh-keys/", headers=auth) for _ in range(12))
            )

    signals.request_started.connect(started)
    try:
        app = ConsoleASGIHandler()
        answers = run_async(concurrently(app)) + run_async(concurrently(app))
    finally:
        signals.request_started.disconnect(started)
    assert [a.status_code for a in answers] == [200] * 24
    names = set(seen)
    assert len(seen) == 24 and len(names) <= 2 and all(n.startswith("api") for n in names)


def test_a_request_that_finds_every_api_thread_held_answers_503_in_time(alice, settings) -> None:
    """API_QUEUE_TIMEOUT: while the only API thread is held (a request waiting on a lock), the
    next request waits that long for it, then answers the API's 503 with Retry-After, in the
    caller's language; the held request still completes, and the next one is served."""
    from django.core import signals

    settings.API_THREADS = 1
    settings.API_QUEUE_TIMEOUT = 0.5
    _token, raw = make_api_token(alice)
    hold, holding = threading.Event(), threading.Event()

    def started(**kwargs) -> None:
        if not holding.is_set():
            holding.set()
            hold.wait(timeout=30)  # the first request keeps the thread

    async def exchange(app: ConsoleASGIHandler) -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            auth = {"Authorization": f"Token {raw}", "Accept-Language": "en"}
            held = asyncio.create_task(c.get("/api/v1/ssh-keys/", headers=auth))
            while not holding.is_set():
                await asyncio.sleep(0.01)
            refused = await c.get("/api/v1/ssh-keys/", headers=auth)
            hold.set()
            return [refused, await held, await c.get("/api/v1/ssh-keys/", headers=auth)]

    signals.request_started.connect(started)
    try:
        refused, held, after = run_async(exchange(ConsoleASGIHandler()))
    finally:
        signals.request_started.disconnect(started)
        hold.set()
    assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
    body = refused.json()
    assert body["error"] == "unavailable" and body["retry_after"] == 5
    assert "retry in 5 seconds" in body["detail"]  # English, as asked
    assert held.status_code == 200 and after.status_code == 200
