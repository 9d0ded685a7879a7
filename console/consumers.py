from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console.events import user_group


class NotificationsConsumer(AsyncJsonWebsocketConsumer):
    """Per-user notifications (worker results, low balance, instance ready). Forwards only."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.group = user_group(user.public_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"kind": "hello", "payload": {}})

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def notify(self, event: dict[str, Any]) -> None:
        await self.send_json({"kind": event["kind"], "payload": event["payload"]})
