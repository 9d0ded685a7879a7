"""排队: a changed start estimate reaches the instance page's websocket (the page then reloads its
live part, where the range is), and an unchanged one sends nothing."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async

from billing import services as billing
from billing.seed import seed_default_prices
from console.routing import websocket_router
from slices import services
from slices.choices import InstanceState
from slices.models import Instance
from slices.services import queue
from tests.slices.factories import load_small_fleet
from tests.support.servers import run_async
from tests.support.websocket import open_websocket, websocket_scope

pytestmark = pytest.mark.django_db(transaction=True)


def test_estimate_change_is_pushed_once(settings, alice) -> None:
    settings.SIM_TIME_SCALE = 0
    settings.SLICES_DRIVER = "sim"
    load_small_fleet()
    seed_default_prices()  # transactional tests flush the migration-seeded price book
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    for _i in range(2):
        services.order_instance(alice, services.OrderRequest(gpu_model="RTX4090", cards=8))
    q, _ = services.order_instance(
        alice, services.OrderRequest(gpu_model="RTX4090", cards=8, when_unavailable="queue")
    )
    assert q.state == InstanceState.QUEUED
    Instance.objects.filter(pk=q.pk).update(start_estimate={})  # as if never estimated

    async def scenario() -> tuple[dict, bool]:
        path = f"/ws/instances/{q.public_id}/"
        communicator, first = await open_websocket(
            websocket_router(), websocket_scope(path, user=alice)
        )
        assert first["type"] == "websocket.accept", first
        hello = json.loads((await communicator.receive_output(timeout=5))["text"])
        assert hello["kind"] == "hello"
        await sync_to_async(queue.refresh_estimates)("RTX4090")
        message = json.loads((await communicator.receive_output(timeout=5))["text"])
        await sync_to_async(queue.refresh_estimates)("RTX4090")  # nothing changed
        quiet = await communicator.receive_nothing(timeout=0.3)
        await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
        await communicator.wait(timeout=5)
        return message, quiet

    message, quiet = run_async(scenario())
    assert message["kind"] == "progress"
    assert quiet
    q.refresh_from_db()
    assert q.start_estimate["position"] == 1 and q.start_estimate["p90"]
