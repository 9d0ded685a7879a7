"""The instance page's websocket (``/ws/instances/<id>/``): what a burst of node log lines sends.

In-process through the real router and the real in-process channel layer, as in
tests/slices/test_telemetry_consumer.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from console.routing import websocket_router
from slices.services.instances import record_logs
from tests.slices.factories import make_instance
from tests.support.servers import run_async
from tests.support.websocket import open_websocket, websocket_scope

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_burst_of_log_lines_is_one_message_in_order(alice) -> None:
    instance = make_instance(alice, state="provisioning")
    lines = [("gpu-node-1", "start", f"layer {i}/200 pulled") for i in range(200)]

    async def scenario() -> tuple[dict[str, Any], bool]:
        path = f"/ws/instances/{instance.public_id}/"
        communicator, first = await open_websocket(
            websocket_router(), websocket_scope(path, user=alice)
        )
        assert first["type"] == "websocket.accept", first
        hello = json.loads((await communicator.receive_output(timeout=5))["text"])
        assert hello["kind"] == "hello"
        await sync_to_async(record_logs)(instance, lines)  # committed: sent at once
        message = json.loads((await communicator.receive_output(timeout=5))["text"])
        quiet = await communicator.receive_nothing(timeout=0.3)
        await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
        await communicator.wait(timeout=5)
        return message, quiet

    message, quiet = run_async(scenario())
    assert message["kind"] == "logs"
    assert [e["text"] for e in message["payload"]] == [text for _n, _s, text in lines]
    assert {e["kind"] for e in message["payload"]} == {"log"}
    assert all(e["id"] for e in message["payload"])  # the stored rows, ids and all
    assert quiet  # one message for the burst, not one per line
