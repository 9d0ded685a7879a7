"""Redis going away under the websockets and the telemetry relay, in-process against a real
redis-server of our own (channels-redis and the Redis ring, as production runs them).

A handshake while Redis is down is accepted and closed with 1013 "try again later"; open sockets
end with 1013 when Redis dies under them, and the consumer leaves no task behind (the telemetry
writer was left pending, "Task was destroyed but it is pending"); the relay keeps ticking through
the outage with one warning, keeps its minute rollups, and sends again once Redis is back.
The same against the real server processes: tests/console/test_redis_outage.py (integration).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from channels.layers import get_channel_layer

from billing.models import PriceBook
from billing.seed import seed_default_prices
from console.consumers import CLOSE_TRY_AGAIN_LATER, LAYER_TIMEOUT_SECONDS
from console.routing import websocket_router
from slices.choices import InstanceState
from slices.models import Instance
from slices.telemetry.relay import Relay
from slices.telemetry.ring import RedisRing
from tests.slices.factories import run_order
from tests.support.servers import run_async, start_redis
from tests.support.websocket import open_websocket, websocket_scope

pytestmark = pytest.mark.django_db(transaction=True)


class PrivateRedis:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc, self.url = start_redis(workdir)
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

    def restart(self) -> None:
        """The same port again, empty (a crash without persistence)."""
        self.proc, _ = start_redis(self.workdir, self.port)


@pytest.fixture
def private_redis(tmp_path: Path, settings) -> Iterator[PrivateRedis]:  # noqa: ANN001
    server = PrivateRedis(tmp_path)
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [server.url]},
        }
    }
    yield server
    if server.proc.poll() is None:
        server.proc.terminate()
        server.proc.wait(timeout=10)


@pytest.fixture
def running(sim_fleet, funded, django_capture_on_commit_callbacks) -> Instance:
    if not PriceBook.objects.exists():  # a transactional test flushed the migration's seed
        seed_default_prices()
    instance = run_order(funded, django_capture_on_commit_callbacks)
    assert instance.state == InstanceState.RUNNING
    return instance


def _paths(instance: Instance) -> list[str]:
    return [
        f"/ws/instances/{instance.public_id}/",
        f"/ws/telemetry/instances/{instance.public_id}/",
        "/ws/notifications/",
    ]


async def _ended_with(communicator: ApplicationCommunicator) -> int:
    """The close code the consumer sent; it then finishes without an exception."""
    while True:
        out = await communicator.receive_output(timeout=15)
        if out["type"] == "websocket.close":
            break
    await communicator.send_input({"type": "websocket.disconnect", "code": out["code"]})
    await communicator.wait(timeout=10)  # raises what the consumer raised
    return out["code"]


def _writers_left() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if "_write" in repr(t.get_coro())]


def test_a_socket_opened_while_redis_is_down_is_closed_with_1013(
    running: Instance, alice, private_redis: PrivateRedis
) -> None:
    private_redis.kill()

    async def handshake(path: str) -> tuple[str, int]:
        scope = websocket_scope(path, user=alice)
        communicator, first = await open_websocket(websocket_router(), scope)
        # Accepted first, so that a browser can read the code (a refused handshake is a 403).
        return first["type"], await _ended_with(communicator)

    async def all_paths() -> list[tuple[str, int]]:
        return [await handshake(path) for path in _paths(running)]

    outcomes = run_async(all_paths())
    assert outcomes == [("websocket.accept", CLOSE_TRY_AGAIN_LATER)] * 3


def test_redis_killed_under_open_sockets_closes_them_with_1013_and_ends_their_tasks(
    running: Instance, alice, private_redis: PrivateRedis
) -> None:
    async def scenario() -> tuple[list[int], list[asyncio.Task[Any]]]:
        communicators = []
        for path in _paths(running):
            communicator, accepted = await open_websocket(
                websocket_router(), websocket_scope(path, user=alice)
            )
            assert accepted["type"] == "websocket.accept", accepted
            hello = await communicator.receive_output(timeout=5)
            assert json.loads(hello["text"])["kind"] == "hello"
            communicators.append(communicator)
        assert _writers_left()  # the telemetry socket's writer runs
        await sync_to_async(private_redis.kill)()
        codes = [await _ended_with(c) for c in communicators]
        await asyncio.sleep(0)
        return codes, _writers_left()

    codes, writers = run_async(scenario())
    assert codes == [CLOSE_TRY_AGAIN_LATER] * 3
    assert writers == []  # cancelled and awaited, not left pending


def test_the_relay_rides_out_a_redis_outage_and_sends_again(
    running: Instance, private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.Redis.from_url(private_redis.url, socket_timeout=2, socket_connect_timeout=2)
    ring = RedisRing(client, maxlen=100, ttl_seconds=600)
    relay = Relay(ring, layer=get_channel_layer())
    public_id = str(running.public_id)
    relay.refresh()
    relay.tick(1000.0)
    assert len(ring.since(public_id)) == 1

    private_redis.kill()
    caplog.set_level(logging.WARNING, logger="slices.telemetry.relay")
    for second in range(1, 6):
        relay.tick(1000.0 + second)  # never raises: the loop would have logged a traceback
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("redis unavailable" in m for m in warnings) == 1, warnings
    assert relay.rollups.flush(None)  # the seconds of the outage are in the minute rollups

    private_redis.restart()
    relay.tick(1010.0)
    assert [e["ts"] for e in ring.since(public_id)] == [1010.0]  # a fresh Redis, written again
    assert any("redis back after" in r.getMessage() for r in caplog.records)
    assert "redis" not in relay.outages


def test_a_handshake_on_a_redis_that_never_answers_is_not_held_forever(
    running: Instance,
    alice,  # noqa: ANN001
    settings,  # noqa: ANN001
) -> None:
    """A Redis that accepts connections and never answers (stopped, partitioned): the join gives
    up after LAYER_TIMEOUT_SECONDS and closes with 1013."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel completes handshakes; nobody ever reads or answers
    try:
        host, port = silent.getsockname()
        settings.CHANNEL_LAYERS = {
            "default": {
                "BACKEND": "channels_redis.core.RedisChannelLayer",
                "CONFIG": {"hosts": [f"redis://{host}:{port}/0"]},
            }
        }

        async def handshake() -> tuple[str, int]:
            scope = websocket_scope(_paths(running)[0], user=alice)
            communicator = ApplicationCommunicator(websocket_router(), scope)
            await communicator.send_input({"type": "websocket.connect"})
            first = await communicator.receive_output(timeout=LAYER_TIMEOUT_SECONDS + 10)
            return first["type"], await _ended_with(communicator)

        assert run_async(handshake()) == ("websocket.accept", CLOSE_TRY_AGAIN_LATER)
    finally:
        silent.close()
