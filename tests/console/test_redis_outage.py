"""A Redis outage under open websockets, an open instance page and a running instance, in
production mode (PostgreSQL, a private Redis, uvicorn, a Celery worker and the telemetry relay as
separate processes; the customer's instance page in headless Chromium).

Redis is killed for about 20 s. The open sockets end with 1013 "try again later" (never without a
close frame), every websocket opened during the outage is accepted and closed with 1013 (never an
HTTP 500), pages answer (``/healthz`` and the charts' ring data say 503), and the web log has no
"Exception in ASGI application" and no "Task was destroyed but it is pending". The page polls
meanwhile and retries its sockets with backoff. Redis restarts on the same port (empty, as after
a crash without persistence): new sockets work, the relay sends again (one warning when Redis
went, one line when it came back) and the page's charts go live and gain points again.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest
import websockets
from playwright.sync_api import Browser as PlaywrightBrowser
from playwright.sync_api import Page, sync_playwright

from tests.support import servers
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, log_in, server_page

pytestmark = pytest.mark.integration

CLOSE_TRY_AGAIN_LATER = 1013
OUTAGE_S = 20.0
NEW_SOCKETS_DURING_OUTAGE = 10

# One process instead of three (each start costs seconds on a loaded machine): the schema, the
# fleet, a customer and their order, which waits in Redis until the worker starts.
PREPARE = """
from decimal import Decimal
from django.core.management import call_command
from billing import services as billing
from console.models import User
from console.services import mark_email_verified
from slices import services
call_command("migrate", "--noinput", verbosity=0)
call_command("load_fleet", verbosity=0)
u = User.objects.create_user("demo", "demo@example.com", {password!r})
mark_email_verified(u)
billing.grant_voucher(u, Decimal("500"), reason="test", valid_days=30)
i, _ = services.order_instance(u, services.OrderRequest(gpu_model="A800", cards=8, name="outage"))
print(i.public_id)
"""
PASSWORD = "outage-password-2026"


@dataclass
class Outage:
    stack: servers.Stack
    redis: subprocess.Popen[bytes]  # the private Redis; the restarted one after the outage
    redis_port: int
    workdir: Path
    public_id: str = ""
    cookie: str = ""


def _until(what: str, probe, timeout: float = 120) -> object:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _login(url: str, username: str, password: str) -> str:
    """A customer's session through the login page; the Cookie header for websockets."""
    client = httpx.Client(base_url=url, timeout=30)
    form = client.get("/accounts/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    response = client.post(
        "/accounts/login/",
        data={"login": username, "password": password, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{url}/accounts/login/"},
    )
    assert response.status_code == 302, response.text[:500]
    return "; ".join(f"{k}={v}" for k, v in client.cookies.items())


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outage]:
    tmp = tmp_path_factory.mktemp("redis-outage")
    redis_proc, redis_url = servers.start_redis(tmp)
    database_url = servers.create_postgres_database(os.environ["DATABASE_URL"])
    env = servers.production_env(database_url, redis_url)
    env.update(SIM_TIME_SCALE="0.01", STATIC_ROOT=str(tmp / "static"), LOG_LEVEL="WARNING")
    stack = servers.Stack(env=env, port=servers.free_port(), tmp=tmp)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    o = Outage(stack, redis_proc, port, tmp)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:  # static files meanwhile
            static = pool.submit(servers.manage, env, "collectstatic", "--noinput", "-v", "0")
            prepared = servers.manage(env, "shell", "-c", PREPARE.format(password=PASSWORD))
            static.result()
        o.public_id = prepared.strip().splitlines()[-1]
        stack.spawn("relay", str(servers.BIN / "python"), "manage.py", "relay_telemetry")
        with ThreadPoolExecutor(max_workers=1) as pool:  # the web server starts meanwhile
            web = pool.submit(stack.start_web)
            _until("the web server to be spawned", lambda: len(stack.procs) == 2)
            stack.start_worker()  # it waits for the last process spawned: the worker
            web.result()
        sql = "SELECT state FROM slices_instance WHERE public_id = %s"
        with psycopg.connect(database_url, autocommit=True) as db:
            _until(
                "the instance to run",
                lambda: db.execute(sql, (o.public_id,)).fetchone()[0] == "running",
            )
        o.cookie = _login(stack.url, "demo", PASSWORD)
        yield o
    finally:
        stack.stop()
        if o.redis.poll() is None:
            o.redis.terminate()
            o.redis.wait(timeout=10)
        servers.drop_postgres_database(database_url)


async def _socket(
    o: Outage, path: str, samples: int = 0, timeout: float = 20
) -> tuple[websockets.ClientConnection, list[dict]]:
    """An open websocket on ``path`` after its hello (and ``samples`` telemetry samples, each
    acknowledged as the page does)."""
    ws = await websockets.connect(
        f"ws://127.0.0.1:{o.stack.port}{path}",
        additional_headers={"Cookie": o.cookie, "Origin": o.stack.url},
        open_timeout=10,
        close_timeout=5,
    )
    got: list[dict] = []
    async with asyncio.timeout(timeout):
        while not got or len([m for m in got if m["kind"] == "sample"]) < samples:
            message = json.loads(await ws.recv())
            got.append(message)
            if message["kind"] == "sample":
                await ws.send('{"kind":"ack"}')
    assert got[0]["kind"] == "hello", got
    return ws, got


async def _closed_with(ws: websockets.ClientConnection, timeout: float = 15) -> int:
    """The code the server closes an open socket with (1006: no close frame)."""
    try:
        async with asyncio.timeout(timeout):
            async for message in ws:
                if json.loads(message).get("kind") == "sample":
                    await ws.send('{"kind":"ack"}')
    except websockets.ConnectionClosed:
        pass
    rcvd = ws.protocol.close_rcvd
    return 1006 if rcvd is None else rcvd.code


async def _handshake_outcome(o: Outage, path: str) -> int | str:
    """What a websocket opened now gets: ``"http <status>"`` if refused, else its close code."""
    try:
        ws = await websockets.connect(
            f"ws://127.0.0.1:{o.stack.port}{path}",
            additional_headers={"Cookie": o.cookie, "Origin": o.stack.url},
            open_timeout=10,
            close_timeout=5,
        )
    except websockets.InvalidStatus as refused:
        return f"http {refused.response.status_code}"
    return await _closed_with(ws)


def _paths(o: Outage) -> list[str]:
    return [
        f"/ws/instances/{o.public_id}/",
        f"/ws/telemetry/instances/{o.public_id}/",
        "/ws/notifications/",
    ]


PAGES = ("/", "/instances/", "/instances/{id}/", "/billing/", "/marketplace/")
# The charts' last hour lives in Redis (the ring): unavailable, and saying so.
HISTORY = "/instances/{id}/telemetry/history.json"


@dataclass
class Browser:
    """The customer's instance page in headless Chromium, and what it asked the server."""

    page: Page
    sockets: list[str] = field(default_factory=list)  # websocket URLs opened, in order
    requests: list[str] = field(default_factory=list)  # HTTP URLs requested, in order

    def attr(self, selector: str, name: str) -> str:
        self.page.wait_for_timeout(50)  # let Playwright deliver what the page did meanwhile
        return self.page.get_attribute(selector, name) or ""

    def points(self) -> int:
        return int(self.attr("#gpu-telemetry", "data-points") or 0)

    def wait(self, what: str, probe, timeout_s: float = 60) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout_s
        while not probe():
            assert time.monotonic() < deadline, f"the page did not get to: {what}"
            self.page.wait_for_timeout(200)


def _open_instance_page(chromium: PlaywrightBrowser, o: Outage) -> Browser:
    page = server_page(chromium, o.stack.url, height=1000)
    log_in(page, "demo", PASSWORD)
    seen = Browser(page)
    page.on("websocket", lambda ws: seen.sockets.append(ws.url))
    page.on("request", lambda request: seen.requests.append(request.url))
    page.goto(f"/instances/{o.public_id}/")
    seen.wait("live charts", lambda: seen.attr(STATUS, "data-status") == "live")
    seen.wait("two points drawn", lambda: seen.points() >= 2)
    return seen


STATUS = "#gpu-telemetry [data-telemetry-status]"


def test_a_redis_outage_closes_sockets_with_a_code_and_everything_resumes(outage: Outage) -> None:
    o = outage
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            browser = _open_instance_page(chromium, o)
            _outage(o, browser)
            _recovery(o, browser)
        finally:
            chromium.close()
    _clean_logs(o)


def _outage(o: Outage, browser: Browser) -> None:
    """Kill Redis under open sockets and the open page; sockets and pages during the outage."""
    paths = _paths(o)
    http = httpx.Client(base_url=o.stack.url, timeout=30, headers={"Cookie": o.cookie})

    async def open_then_kill() -> list[int]:
        page, _ = await _socket(o, paths[0])
        charts, _ = await _socket(o, paths[1], samples=2)
        notifications, _ = await _socket(o, paths[2])
        o.redis.kill()  # the crash: every connection to it drops at once
        o.redis.wait(timeout=10)
        return list(
            await asyncio.gather(*(_closed_with(ws) for ws in (page, charts, notifications)))
        )

    seen_before = len(browser.sockets), len(browser.requests)
    open_codes = servers.run_async(open_then_kill())
    down_at = time.monotonic()
    assert open_codes == [CLOSE_TRY_AGAIN_LATER] * 3, (open_codes, o.stack.logs())

    async def during() -> list[int | str]:
        return list(
            await asyncio.gather(
                *(
                    _handshake_outcome(o, paths[i % len(paths)])
                    for i in range(NEW_SOCKETS_DURING_OUTAGE)
                )
            )
        )

    outcomes = servers.run_async(during())
    assert outcomes == [CLOSE_TRY_AGAIN_LATER] * NEW_SOCKETS_DURING_OUTAGE, (
        outcomes,
        o.stack.logs(),
    )
    statuses = {p: http.get(p.format(id=o.public_id)).status_code for p in PAGES}
    assert all(s < 500 for s in statuses.values()), (statuses, o.stack.logs())
    ring = http.get(HISTORY.format(id=o.public_id))
    assert ring.status_code == 503 and ring.headers["Retry-After"], ring.text[:300]
    health = http.get("/healthz")
    assert health.status_code == 503 and health.json()["channel_layer"].startswith("error")
    browser.page.wait_for_timeout(max(0.0, OUTAGE_S - (time.monotonic() - down_at)) * 1000)
    relay = next(p for p in o.stack.procs if p.name == "relay")
    assert relay.popen.poll() is None, relay.output()  # the relay rode it out

    # The page fell back to polling: the instance's events and the charts' points over HTTP,
    # and retried its sockets with backoff (about 5 tries in 20 s, not one a second).
    assert browser.attr(STATUS, "data-status") == "reconnecting"
    sockets, requests = browser.sockets[seen_before[0] :], browser.requests[seen_before[1] :]
    assert any("part=events" in url for url in requests), requests
    assert sum("telemetry/history.json" in url for url in requests) >= 2, requests
    chart_tries = sum("/ws/telemetry/" in url for url in sockets)
    assert 1 <= chart_tries <= 8, sockets


def _recovery(o: Outage, browser: Browser) -> None:
    """Redis back on its port, empty: new sockets work, samples flow, the page goes live again."""
    paths = _paths(o)
    o.redis, _url = servers.start_redis(o.workdir, o.redis_port)
    o.stack.wait_healthy(timeout=60)

    async def after() -> tuple[list[dict], list[dict], list[dict]]:
        page, hello = await _socket(o, paths[0])
        charts, samples = await _socket(o, paths[1], samples=3, timeout=30)
        notifications, greeting = await _socket(o, paths[2])
        for ws in (page, charts, notifications):
            await ws.close()
        return hello, samples, greeting

    hello, samples, greeting = servers.run_async(after())
    assert hello[0]["kind"] == greeting[0]["kind"] == "hello"
    assert sum(m["kind"] == "sample" for m in samples) >= 3  # the relay sends again
    history = httpx.get(
        o.stack.url + HISTORY.format(id=o.public_id), headers={"Cookie": o.cookie}, timeout=30
    )
    assert history.status_code == 200 and history.json()["entries"], history.text[:300]
    points = browser.points()
    browser.wait("live again", lambda: browser.attr(STATUS, "data-status") == "live")
    browser.wait("new points", lambda: browser.points() > points)


def _clean_logs(o: Outage) -> None:
    web = next(p for p in o.stack.procs if p.name == "web")
    web.popen.send_signal(signal.SIGTERM)  # "Task was destroyed" shows when the loop closes
    web.popen.wait(timeout=30)
    log = web.log.read_text(errors="replace")
    assert "Exception in ASGI application" not in log, log
    assert "Task was destroyed but it is pending" not in log, log
    assert "Internal Server Error" not in log, log
    # The relay rode it out: one warning when Redis went, one when it came back, no traceback.
    relay = next(p for p in o.stack.procs if p.name == "relay")
    relay_log = relay.log.read_text(errors="replace")
    assert relay_log.count("redis unavailable") == 1, relay_log
    assert "redis back after" in relay_log and "Traceback" not in relay_log, relay_log
