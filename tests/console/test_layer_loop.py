"""console.layer_loop: synchronous code reaches the channel layer over one event loop per process
(not a new thread, loop and Redis connection per message), posted broadcasts go out in order
without the caller waiting, and one that fails or hangs does not hold the next."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from channels.layers import get_channel_layer

from console import layer_loop
from slices import events
from tests.support.servers import base_env, start_redis

ROOT = Path(__file__).resolve().parents[2]


def test_posted_calls_run_in_order_on_one_thread_after_the_caller_has_moved_on() -> None:
    gate = threading.Event()
    ran: list[tuple[int, int]] = []

    async def first() -> None:
        while not gate.is_set():  # holds the queue until the caller has returned from post()
            await asyncio.sleep(0.01)
        ran.append((0, threading.get_ident()))

    async def record(i: int) -> None:
        ran.append((i, threading.get_ident()))

    layer_loop.post(first(), timeout=10)
    for i in range(1, 50):
        layer_loop.post(record(i), timeout=10)
    assert ran == []  # every post() returned before anything it posted ran
    gate.set()
    layer_loop.flush()
    assert [i for i, _ in ran] == list(range(50))
    threads = {ident for _, ident in ran}
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_a_failing_or_hanging_posted_call_does_not_hold_the_next() -> None:
    ran: list[str] = []

    async def fails() -> None:
        raise ConnectionError("the layer is away")

    async def hangs() -> None:
        await asyncio.sleep(3600)
        ran.append("never")

    async def after() -> None:
        ran.append("after")

    layer_loop.post(fails(), timeout=5)
    layer_loop.post(hangs(), timeout=0.2)
    layer_loop.post(after(), timeout=5)
    layer_loop.flush()
    assert ran == ["after"]


def test_what_a_process_posted_goes_out_before_it_exits(tmp_path: Path) -> None:
    marker = tmp_path / "sent"
    code = (
        "import asyncio\n"
        "from console import layer_loop\n"
        "async def late():\n"
        "    await asyncio.sleep(0.3)\n"
        f"    open({str(marker)!r}, 'w').write('sent')\n"
        "layer_loop.post(late(), timeout=5)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=base_env(), check=True, timeout=120)
    assert marker.read_text() == "sent"


def test_run_returns_the_result_raises_the_error_and_gives_up_after_its_timeout() -> None:
    async def answer() -> int:
        return 42

    async def fails() -> None:
        raise ValueError("no")

    async def hangs() -> None:
        await asyncio.sleep(3600)

    assert layer_loop.run(answer()) == 42
    with pytest.raises(ValueError, match="no"):
        layer_loop.run(fails())
    with pytest.raises(TimeoutError):
        layer_loop.run(hangs(), timeout=0.2)


def test_async_code_is_told_to_await_instead() -> None:
    async def inner() -> None:
        async def noop() -> None:
            return None

        with pytest.raises(RuntimeError, match="await"):
            layer_loop.run(noop())
        with pytest.raises(RuntimeError, match="await"):
            layer_loop.post(noop(), timeout=1)

    asyncio.run(inner())


@pytest.fixture
def redis_layer(tmp_path: Path, settings):  # noqa: ANN001, ANN201
    proc, url = start_redis(tmp_path)
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [url]}}
    }
    try:
        yield redis.Redis.from_url(url)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_burst_of_broadcasts_reaches_the_page_in_order_over_one_redis_connection(
    redis_layer: redis.Redis,
) -> None:
    layer = get_channel_layer()
    received: list[int] = []

    async def listen() -> None:
        channel = await layer.new_channel()
        await layer.group_add("instance.burst", channel)
        listening.set()
        while len(received) < 150:
            message = await layer.receive(channel)
            received.append(message["payload"]["n"])

    listening = threading.Event()
    listener = threading.Thread(target=lambda: asyncio.run(listen()), daemon=True)
    listener.start()
    assert listening.wait(10)
    before = redis_layer.info("stats")["total_connections_received"]
    started = time.monotonic()
    for n in range(150):  # what provisioning a 64-card slice broadcasts
        events._send("instance.burst", {"type": "instance.message", "payload": {"n": n}})
    layer_loop.flush()
    listener.join(timeout=30)
    opened = redis_layer.info("stats")["total_connections_received"] - before
    assert received == list(range(150)), f"after {time.monotonic() - started:.1f} s"
    # The layer loop's own connection (one pool; async_to_sync opened one per message).
    assert opened <= 2, opened
