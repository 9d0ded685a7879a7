"""The console as real processes, in both modes.

Embedded default: one ASGI server process with SQLite, the in-process channel layer and the embedded
Celery worker. Production (integration): the ASGI server on PostgreSQL + channels-redis, and a
separate `celery worker` process consuming from Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import websockets

from tests.support import servers

OPS_PASSWORD = "ops-password-for-tests-1"


def _prepare(env: dict[str, str]) -> str:
    servers.migrate(env)
    servers.create_superuser(env, "ops", OPS_PASSWORD)
    out = servers.manage(
        env,
        "shell",
        "-c",
        "from console.models import User; print(User.objects.get(username='ops').public_id)",
    )
    return out.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def embedded_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[servers.Stack, str]]:
    tmp = tmp_path_factory.mktemp("embedded")
    env = servers.embedded_env(tmp)
    public_id = _prepare(env)
    stack = servers.Stack(env=env, port=servers.free_port(), tmp=tmp)
    try:
        stack.start_web()
        yield stack, public_id
    finally:
        stack.stop()


def _production_stack(
    tmp_path_factory: pytest.TempPathFactory, broker_url: str | None
) -> Iterator[tuple[servers.Stack, str]]:
    database_url = servers.create_postgres_database(os.environ["DATABASE_URL"])
    tmp = tmp_path_factory.mktemp("production")
    env = servers.production_env(database_url, os.environ["REDIS_URL"])
    if broker_url:
        env["CELERY_BROKER_URL"] = broker_url
    env["STATIC_ROOT"] = str(tmp / "static")
    servers.manage(env, "collectstatic", "--noinput", "-v", "0")
    stack = servers.Stack(env=env, port=servers.free_port(), tmp=tmp)
    try:
        public_id = _prepare(env)
        stack.start_worker()
        stack.start_web()
        yield stack, public_id
    finally:
        stack.stop()
        servers.drop_postgres_database(database_url)


@pytest.fixture(scope="module")
def production_stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[servers.Stack, str]]:
    yield from _production_stack(tmp_path_factory, None)


@pytest.fixture(scope="module")
def rabbitmq_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[servers.Stack, str]]:
    broker = os.environ.get("IT_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
    yield from _production_stack(tmp_path_factory, broker)


def _session(stack: servers.Stack) -> httpx.Client:
    client = httpx.Client(base_url=stack.url, timeout=10)
    servers.login(client, "ops", OPS_PASSWORD)
    return client


def _ws_url(stack: servers.Stack) -> str:
    return f"ws://127.0.0.1:{stack.port}/ws/notifications/"


def _cookie_header(client: httpx.Client) -> str:
    return "; ".join(f"{k}={v}" for k, v in client.cookies.items())


async def _next(ws: websockets.ClientConnection, kind: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        message = json.loads(await asyncio.wait_for(ws.recv(), timeout=max(remaining, 0.01)))
        if message["kind"] == kind:
            return message


def _check_pages_and_health(stack: servers.Stack) -> None:
    home = httpx.get(f"{stack.url}/", timeout=10)
    assert home.status_code == 200, stack.logs()
    health = httpx.get(f"{stack.url}/healthz", timeout=10)
    assert health.status_code == 200
    assert health.json()["channel_layer"] == "ok"
    assert health.json()["database"] == "ok"


async def _broadcast_and_task(stack: servers.Stack, public_id: str, outside_send) -> None:
    client = _session(stack)
    headers = {"Cookie": _cookie_header(client), "Origin": stack.url}
    async with websockets.connect(_ws_url(stack), additional_headers=headers) as ws:
        assert (await _next(ws, "hello"))["payload"] == {}

        # (b) a message sent through the channel layer from outside the consumer reaches the socket.
        token = uuid.uuid4().hex
        await outside_send(client, public_id, token)
        message = await _next(ws, "diagnostic.broadcast")
        assert message["payload"]["token"] == token

        # (c) an HTTP request enqueues a task; it answers before the task finishes, and the task's
        # result is pushed to this socket by the worker.
        token = uuid.uuid4().hex
        response = client.post(
            "/diagnostics/ping/",
            data={"token": token, "delay": "1.5"},
            headers={"X-CSRFToken": client.cookies["csrftoken"], "Referer": stack.url + "/"},
        )
        answered_at = time.time()
        assert response.status_code == 202, response.text
        pong = await _next(ws, "diagnostic.pong")
        assert pong["payload"]["token"] == token
        assert pong["payload"]["finished_at"] > answered_at  # the request did not wait for the task


async def _refusals(stack: servers.Stack) -> None:
    client = _session(stack)
    foreign = {"Cookie": _cookie_header(client), "Origin": "http://evil.example"}
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(_ws_url(stack), additional_headers=foreign):
            pass
    assert refused.value.response.status_code == 403

    # Anonymous: the consumer closes before accepting, so the handshake itself is refused.
    with pytest.raises(websockets.InvalidStatus) as anonymous:
        async with websockets.connect(_ws_url(stack), additional_headers={"Origin": stack.url}):
            pass
    assert anonymous.value.response.status_code == 403


async def _send_via_view(client: httpx.Client, public_id: str, token: str) -> None:
    response = client.post(
        "/diagnostics/broadcast/",
        data={"token": token},
        headers={"X-CSRFToken": client.cookies["csrftoken"], "Referer": str(client.base_url) + "/"},
    )
    assert response.status_code == 200


# The checks that are the same in both modes; production's need PostgreSQL and Redis.
MODES = [
    pytest.param("embedded_stack", id="embedded"),
    pytest.param("production_stack", id="production", marks=pytest.mark.integration),
]


@pytest.mark.parametrize("mode", MODES)
def test_server_serves_pages_and_health(mode: str, request: pytest.FixtureRequest) -> None:
    stack, _ = request.getfixturevalue(mode)
    _check_pages_and_health(stack)


@pytest.mark.parametrize("mode", MODES)
def test_websocket_refuses_foreign_origin_and_anonymous(
    mode: str, request: pytest.FixtureRequest
) -> None:
    stack, _ = request.getfixturevalue(mode)
    servers.run_async(_refusals(stack))


def test_embedded_websocket_gets_channel_layer_message_and_task_result(embedded_stack) -> None:
    stack, public_id = embedded_stack
    servers.run_async(_broadcast_and_task(stack, public_id, _send_via_view))


@pytest.mark.integration
def test_production_websocket_gets_redis_message_and_worker_process_result(
    production_stack,
) -> None:
    from channels_redis.core import RedisChannelLayer

    stack, public_id = production_stack
    layer = RedisChannelLayer(hosts=[os.environ["REDIS_URL"]])

    async def send_from_this_process(client: httpx.Client, public_id: str, token: str) -> None:
        # This test process is neither the web server nor the worker: the message crosses Redis.
        await layer.group_send(
            f"user.{public_id}",
            {"type": "notify", "kind": "diagnostic.broadcast", "payload": {"token": token}},
        )

    async def run() -> None:
        try:
            await _broadcast_and_task(stack, public_id, send_from_this_process)
        finally:
            await layer.flush()

    servers.run_async(run())
    assert "console.ping_worker_task" in stack.procs[0].output()  # the separate worker ran it


@pytest.mark.integration
def test_production_worker_runs_tasks_from_rabbitmq(rabbitmq_stack) -> None:
    stack, public_id = rabbitmq_stack
    servers.run_async(_broadcast_and_task(stack, public_id, _send_via_view))
    worker_log = stack.procs[0].output()
    assert "amqp://" in worker_log
    assert "console.ping_worker_task" in worker_log
