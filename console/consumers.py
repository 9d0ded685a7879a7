from __future__ import annotations

import json
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer

from console.events import user_group

# Websocket close codes: the standard ones (RFC 6455 §7.4.1) and ours in the 4000 range, which
# mirror HTTP statuses so a browser can tell "log in again" from "no such page".
CLOSE_UNSUPPORTED_DATA = 1003  # a binary frame where only JSON text is spoken
CLOSE_MESSAGE_TOO_BIG = 1009
CLOSE_BAD_REQUEST = 4400  # text that is not a JSON object
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404

# The browser sends nothing but small control messages; anything larger is refused unparsed.
MAX_FRAME_CHARS = 64 * 1024


class ForwardingJsonConsumer(AsyncJsonWebsocketConsumer):
    """Base for consumers that push JSON to the browser and expect (almost) nothing back.

    Whatever a client sends is checked before it is parsed: binary frames, oversized frames and
    text that is not a JSON object (including JSON nested deeper than Python's parser can follow)
    end the connection with a close code saying why, never with an exception that drops the
    socket without a close frame. Subclasses handle well-formed objects in ``receive_message``.
    """

    closing = False

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        self.closing = True
        await super().close(code=code, reason=reason)

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        if self.closing:
            return  # frames already in flight when we closed: closing twice is a protocol error
        if text_data is None:
            await self.close(code=CLOSE_UNSUPPORTED_DATA)
            return
        if len(text_data) > MAX_FRAME_CHARS:
            await self.close(code=CLOSE_MESSAGE_TOO_BIG)
            return
        try:
            message = json.loads(text_data)
        except (ValueError, RecursionError):  # RecursionError: '[[[[…' nested 1000 deep
            message = None
        if not isinstance(message, dict):
            await self.close(code=CLOSE_BAD_REQUEST)
            return
        await self.receive_message(message)

    async def receive_message(self, message: dict[str, Any]) -> None:
        """A well-formed object from the browser; ignored unless a subclass says otherwise."""


class NotificationsConsumer(ForwardingJsonConsumer):
    """Per-user notifications (worker results, low balance, instance ready). Forwards only."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
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


class UnknownPathConsumer(AsyncWebsocketConsumer):
    """Every websocket path no route matches: accepted only to be closed with 4404.

    Without it Channels' router raises "No route found" and the server answers the handshake with
    a 500. Accepting first lets the browser read the close code (a refusal during the handshake
    reaches it only as a failed connection).
    """

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=CLOSE_NOT_FOUND)

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        """Frames racing the close are dropped."""
