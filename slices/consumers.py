"""Websocket consumers of the slices app: an instance's live progress, events and logs."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.http import Http404

from slices.events import instance_group
from slices.services.instances import get_instance_for_operator, get_instance_for_user


class InstanceConsumer(AsyncJsonWebsocketConsumer):
    """Joins ``instance.<uuid>`` after checking the user may see it; then only forwards."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        public_id = self.scope["url_route"]["kwargs"]["public_id"]
        if not await self._may_see(user, public_id):
            await self.close(code=4404)
            return
        self.group = instance_group(public_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"kind": "hello", "payload": {}})

    @database_sync_to_async
    def _may_see(self, user: Any, public_id: str) -> bool:
        try:
            if user.is_staff:
                get_instance_for_operator(public_id)
            else:
                get_instance_for_user(user, public_id)
        except Http404:
            return False
        return True

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Browsers only listen here; anything they send is ignored."""

    async def instance_message(self, event: dict[str, Any]) -> None:
        await self.send_json({"kind": event["kind"], "payload": event["payload"]})
