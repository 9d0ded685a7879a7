"""Websocket consumers of the slices app: an instance's live progress, events and logs; live GPU
telemetry."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from channels.db import database_sync_to_async
from django.http import Http404

from console.consumers import (
    CLOSE_NOT_FOUND,
    CLOSE_UNAUTHENTICATED,
    OUTAGE_ERRORS,
    ForwardingJsonConsumer,
    LayerConsumer,
)
from slices.events import instance_group
from slices.models import Cluster
from slices.services.instances import get_instance_for_operator, get_instance_for_user
from slices.telemetry.groups import cluster_group as telemetry_cluster_group
from slices.telemetry.groups import instance_group as telemetry_instance_group
from slices.telemetry.metrics import websocket_client_changed

logger = logging.getLogger(__name__)


@database_sync_to_async
def _may_see_instance(user: Any, public_id: str) -> bool:
    """The owner sees their instance; operators see the fleet; anyone else gets "not found"."""
    try:
        if user.is_staff:
            get_instance_for_operator(public_id)
        else:
            get_instance_for_user(user, public_id)
    except Http404:
        return False
    return True


class InstanceConsumer(LayerConsumer):
    """Joins ``instance.<uuid>`` after checking the user may see it; then only forwards. A Redis
    outage closes it with 1013 (``LayerConsumer``); the page polls meanwhile and reconnects."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        public_id = self.scope["url_route"]["kwargs"]["public_id"]
        if not await _may_see_instance(user, public_id):
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await self.join(instance_group(public_id))
        await self.accept()
        await self.send_json({"kind": "hello", "payload": {}})

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Browsers only listen here; anything they send is ignored."""

    async def instance_message(self, event: dict[str, Any]) -> None:
        await self.send_json({"kind": event["kind"], "payload": event["payload"]})


# Samples a telemetry client may hold unacknowledged (one being drawn, one on the way).
TELEMETRY_WINDOW = 2


class TelemetryConsumer(ForwardingJsonConsumer):
    """Live GPU samples of one instance (``telemetry.instance.<uuid>``) or, for operators, of one
    cluster (``telemetry.cluster.<code>``). Permission is checked before joining, on every
    connect (so also on every reconnect); then it only forwards.

    Back-pressure: samples are not queued per client. The newest waits in one slot; a writer task
    sends it once the client has acknowledged (``{"kind": "ack"}`` after drawing each sample) all
    but ``TELEMETRY_WINDOW - 1`` of the samples it was sent. A slow browser therefore gets the
    latest sample (with ``skipped``: how many were replaced meanwhile), never a backlog, not even
    one hidden in the kernel's socket buffers, and memory stays flat whatever the client's speed.

    The writer is a ``background`` task: cancelled and awaited however the connection ends (a
    Redis outage closes it with 1013; the charts reconnect and fetch the gap).
    """

    counted = False  # this connection is in the open-websockets gauge

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        kwargs = self.scope["url_route"]["kwargs"]
        if "code" in kwargs:
            if not (user.is_staff and await self._cluster_exists(kwargs["code"])):
                await self.close(code=CLOSE_NOT_FOUND)
                return
            group = telemetry_cluster_group(kwargs["code"])
            self.stream = "cluster"
        else:
            if not await _may_see_instance(user, kwargs["public_id"]):
                await self.close(code=CLOSE_NOT_FOUND)
                return
            group = telemetry_instance_group(kwargs["public_id"])
            self.stream = "instance"
        self._latest: str | None = None  # the newest sample, JSON
        self._skipped = 0
        self._ready = asyncio.Event()
        self._unacked = 0
        self._credit = asyncio.Event()
        await self.join(group)
        await self.accept()
        await database_sync_to_async(websocket_client_changed)(self.stream, 1)
        self.counted = True
        await self.send_json({"kind": "hello", "payload": {}})
        self.background(self._write())

    @database_sync_to_async
    def _cluster_exists(self, code: str) -> bool:
        return Cluster.objects.filter(code=code).exists()

    async def disconnect(self, code: int) -> None:
        await super().disconnect(code)  # the writer first: it is awaited, then the groups
        if self.counted:
            self.counted = False
            try:
                await database_sync_to_async(websocket_client_changed)(self.stream, -1)
            except OUTAGE_ERRORS as exc:  # the gauge lives in Redis: gone with it
                logger.debug("telemetry client gauge not decremented: %r", exc)

    async def telemetry_sample(self, event: dict[str, Any]) -> None:
        """``text``: the payload as the relay encoded it once for every watcher (``payload``: a
        dict, encoded here)."""
        if self._latest is not None:
            self._skipped += 1  # the client has not taken the previous one yet: replace it
        text = event.get("text")
        self._latest = text if isinstance(text, str) else json.dumps(event["payload"])
        self._ready.set()

    async def receive_message(self, message: dict[str, Any]) -> None:
        if message.get("kind") == "ack":
            self._unacked = max(0, self._unacked - 1)
            self._credit.set()

    async def _write(self) -> None:
        while True:
            await self._ready.wait()
            while self._unacked >= TELEMETRY_WINDOW:  # the client has not drawn what it has
                self._credit.clear()
                await self._credit.wait()
            self._ready.clear()
            payload, skipped = self._latest, self._skipped
            self._latest, self._skipped = None, 0
            if payload is None:
                continue
            if self.closing:
                return  # nothing may follow the close frame
            self._unacked += 1
            await self.send(
                text_data=f'{{"kind":"sample","skipped":{skipped},"payload":{payload}}}'
            )
