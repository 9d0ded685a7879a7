"""The telemetry websocket: who may join which stream (also on reconnect), what it forwards, and
that a slow client gets the latest sample instead of an ever-growing queue.

In-process through the real router and the real in-process channel layer, as in
tests/console/test_websockets.py; the relay ticks against a running simulated instance.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from channels.layers import get_channel_layer
from django.contrib.auth.models import AnonymousUser

from billing.models import PriceBook
from billing.seed import seed_default_prices
from console.consumers import CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED
from console.routing import websocket_router
from slices.choices import InstanceState
from slices.models import GpuRollup, Instance
from slices.telemetry.groups import instance_group
from slices.telemetry.heat import unpack_nodes
from slices.telemetry.relay import Relay
from slices.telemetry.ring import MemoryRing
from tests.slices.factories import run_order
from tests.support.servers import run_async
from tests.support.websocket import open_websocket, websocket_scope

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def running(sim_fleet, funded, django_capture_on_commit_callbacks) -> Instance:
    if not PriceBook.objects.exists():  # a transactional test flushed the migration's seed
        seed_default_prices()
    instance = run_order(funded, django_capture_on_commit_callbacks)
    assert instance.state == InstanceState.RUNNING
    return instance


async def _open(path: str, user: object) -> tuple[ApplicationCommunicator, dict[str, Any]]:
    return await open_websocket(websocket_router(), websocket_scope(path, user=user))


async def _refused(path: str, user: object) -> int:
    communicator, first = await _open(path, user)
    assert first["type"] == "websocket.close", first  # refused before accepting: never joined
    await communicator.send_input({"type": "websocket.disconnect", "code": first["code"]})
    await communicator.wait(timeout=5)
    return first["code"]


def _path(instance: Instance) -> str:
    return f"/ws/telemetry/instances/{instance.public_id}/"


def _cluster_path(instance: Instance) -> str:
    return f"/ws/telemetry/clusters/{instance.nodes.get().node.cluster.code}/"


def test_owner_gets_live_samples_of_their_instance(running: Instance, alice) -> None:
    relay = Relay(MemoryRing(), layer=get_channel_layer())

    async def scenario() -> dict[str, Any]:
        communicator, first = await _open(_path(running), alice)
        assert first["type"] == "websocket.accept"
        hello = await communicator.receive_output(timeout=5)
        assert json.loads(hello["text"])["kind"] == "hello"
        await sync_to_async(relay.refresh)()
        await sync_to_async(relay.tick)()
        message = json.loads((await communicator.receive_output(timeout=5))["text"])
        await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
        await communicator.wait(timeout=5)
        return message

    message = run_async(scenario())
    assert message["kind"] == "sample" and message["skipped"] == 0
    assert len(message["payload"]["g"]) == 8 and message["payload"]["sim"] is True


def test_another_customer_is_refused_also_on_reconnect(running: Instance, bob) -> None:
    for _attempt in range(3):  # a page that keeps reconnecting is checked every time
        assert run_async(_refused(_path(running), bob)) == CLOSE_NOT_FOUND
    assert run_async(_refused(_path(running), AnonymousUser())) == CLOSE_UNAUTHENTICATED
    missing = "/ws/telemetry/instances/00000000-0000-0000-0000-000000000000/"
    assert run_async(_refused(missing, bob)) == CLOSE_NOT_FOUND


def test_a_customer_cannot_watch_a_cluster_but_an_operator_can(
    running: Instance, alice, operator
) -> None:
    assert run_async(_refused(_cluster_path(running), alice)) == CLOSE_NOT_FOUND
    assert run_async(_refused("/ws/telemetry/clusters/no-such-cluster/", operator)) == 4404
    relay = Relay(MemoryRing(), layer=get_channel_layer())
    cluster_path, instance_path = _cluster_path(running), _path(running)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        fleet, first = await _open(cluster_path, operator)
        assert first["type"] == "websocket.accept"
        inst, first = await _open(instance_path, operator)  # operators see every instance
        assert first["type"] == "websocket.accept"
        for c in (fleet, inst):
            await c.receive_output(timeout=5)  # hello
        await sync_to_async(relay.refresh)()
        await sync_to_async(relay.tick)()
        heat = json.loads((await fleet.receive_output(timeout=5))["text"])
        sample = json.loads((await inst.receive_output(timeout=5))["text"])
        for c in (fleet, inst):
            await c.send_input({"type": "websocket.disconnect", "code": 1000})
            await c.wait(timeout=5)
        return heat, sample

    heat, sample = run_async(scenario())
    hostname = running.nodes.get().hostname
    assert list(unpack_nodes(heat["payload"])) == [hostname]
    assert len(sample["payload"]["g"]) == 8


def test_a_slow_client_gets_the_latest_sample_not_a_queue(running: Instance, alice) -> None:
    """The transport stalls (a browser that stopped reading): 60 samples arrive meanwhile. When it
    drains, the client gets the newest one, told how many it skipped; none piled up."""
    sent = 60

    async def scenario() -> list[dict[str, Any]]:
        layer = get_channel_layer()
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        delivered: list[dict[str, Any]] = []
        gate = asyncio.Event()
        gate.set()

        async def receive() -> dict[str, Any]:
            return await inbox.get()

        async def send(message: dict[str, Any]) -> None:
            await gate.wait()  # a full socket buffer: the send does not return
            delivered.append(message)

        await inbox.put({"type": "websocket.connect"})
        app = asyncio.create_task(
            websocket_router()(websocket_scope(_path(running), user=alice), receive, send)
        )
        while len(delivered) < 2:  # accept + hello
            await asyncio.sleep(0.01)
        gate.clear()
        group = instance_group(running.public_id)
        for seq in range(1, sent + 1):
            payload = {"ts": float(seq), "seq": seq, "g": []}
            await layer.group_send(group, {"type": "telemetry.sample", "payload": payload})
        # Let the consumer take every message off the layer (none may stay queued there).
        for _ in range(500):
            if all(q.empty() for q in layer.channels.values()):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        gate.set()
        acked = 0
        for _ in range(500):
            texts = [json.loads(m["text"]) for m in delivered[2:] if "text" in m]
            for _sample in texts[acked:]:  # the page acknowledges each sample it has drawn
                await inbox.put({"type": "websocket.receive", "text": '{"kind": "ack"}'})
            acked = len(texts)
            if texts and texts[-1]["payload"]["seq"] == sent:
                break
            await asyncio.sleep(0.01)
        await inbox.put({"type": "websocket.disconnect", "code": 1000})
        await asyncio.wait_for(app, 5)
        return [json.loads(m["text"]) for m in delivered[2:] if "text" in m]

    messages = run_async(scenario())
    assert messages[-1]["payload"]["seq"] == sent  # the newest sample got through
    assert len(messages) <= 3  # the one stuck in the socket, maybe one more, then the newest
    # Every sample is accounted for: delivered, or replaced by a newer one and counted.
    assert len(messages) + sum(m["skipped"] for m in messages) == sent


def test_the_relay_loop_ticks_until_stopped_then_writes_the_unfinished_minute(
    running: Instance,
) -> None:
    """What the embedded thread and ``manage.py relay_telemetry`` run."""
    ring = MemoryRing()
    relay = Relay(ring, layer=get_channel_layer())
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop, 0.02))
    thread.start()
    try:
        for _ in range(1000):
            if len(ring.since(str(running.public_id))) >= 5:
                break
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert relay.feeds == {}  # sources closed
    rollups = GpuRollup.objects.filter(instance=running)
    assert rollups.count() in (8, 16)  # the partial minute (or two, across a minute boundary)
    assert all(r.samples >= 1 for r in rollups)


def test_a_client_that_does_not_acknowledge_gets_no_backlog(running: Instance, alice) -> None:
    """Sends that never block (a socket whose kernel buffers still take data) must not hide a
    backlog either: past the window of unacknowledged samples, only the newest is kept."""
    sent = 30

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        layer = get_channel_layer()
        communicator, first = await _open(_path(running), alice)
        assert first["type"] == "websocket.accept"
        await communicator.receive_output(timeout=5)  # hello
        group = instance_group(running.public_id)
        for seq in range(1, sent + 1):
            payload = {"ts": float(seq), "seq": seq, "g": []}
            await layer.group_send(group, {"type": "telemetry.sample", "payload": payload})
        before: list[dict[str, Any]] = []
        while not await communicator.receive_nothing(timeout=0.5):
            before.append(json.loads((await communicator.receive_output(timeout=5))["text"]))
        after: list[dict[str, Any]] = []
        for _ in before:
            await communicator.send_input({"type": "websocket.receive", "text": '{"kind": "ack"}'})
        while not await communicator.receive_nothing(timeout=0.5):
            after.append(json.loads((await communicator.receive_output(timeout=5))["text"]))
        await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
        await communicator.wait(timeout=5)
        return before, after

    before, after = run_async(scenario())
    assert 1 <= len(before) <= 2  # the window: nothing more until the client has drawn them
    assert after and after[-1]["payload"]["seq"] == sent  # then the newest, not the backlog
    delivered = before + after
    assert len(delivered) + sum(m["skipped"] for m in delivered) == sent
