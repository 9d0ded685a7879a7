"""The console's websocket consumers and the bases every app's consumers build on.

Redis outages (production's channel layer): a consumer whose ``group_add``, ``group_send`` or
channel receive fails because the layer (or the database) is unreachable ends the websocket with
``CLOSE_TRY_AGAIN_LATER`` (1013) and a one-line warning, never an exception out of the ASGI
application (an HTTP 500 during the handshake, a close without a code after it). A handshake made
while the layer is down is accepted only to be closed with that code, so the browser can read it
(a refused handshake reaches it only as a failed connection) and retry with backoff. Background
tasks a consumer starts are cancelled and awaited however the connection ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Coroutine
from typing import Any

from channels.db import aclose_old_connections
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer

from console.events import user_group
from console.retries import TRANSIENT_ERRORS

logger = logging.getLogger(__name__)

# Websocket close codes: the standard ones (RFC 6455 §7.4.1 and IANA's registry) and ours in the
# 4000 range, which mirror HTTP statuses so a browser can tell "log in again" from "no such page".
CLOSE_UNSUPPORTED_DATA = 1003  # a binary frame where only JSON text is spoken
CLOSE_MESSAGE_TOO_BIG = 1009
# "Try Again Later" (IANA): the channel layer (Redis) or the database is unreachable for now. The
# browser keeps the page up (polling what it can) and reconnects with backoff.
CLOSE_TRY_AGAIN_LATER = 1013
CLOSE_BAD_REQUEST = 4400  # text that is not a JSON object
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404

# The browser sends nothing but small control messages; anything larger is refused unparsed.
MAX_FRAME_CHARS = 64 * 1024

# How long a consumer waits on the channel layer (joining or leaving a group) before it gives up:
# a Redis that hangs (stopped, partitioned) must not hold a handshake open forever.
LAYER_TIMEOUT_SECONDS = 5.0

# What an outage raises: the transient errors (console/retries.py: Redis unreachable or still
# loading after a restart, the database cut) and our own timeout on a Redis that hangs. Not OSError
# at large: uvicorn's ClientDisconnected is one, and a client that left is no outage.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, TimeoutError)


class LayerConsumer(AsyncJsonWebsocketConsumer):
    """Base of the consumers that join channel-layer groups: survives the layer going away.

    ``join`` adds the connection to a group (bounded by ``LAYER_TIMEOUT_SECONDS``); ``background``
    starts a task tied to the connection. ``disconnect`` runs exactly once however the connection
    ends (the client left, the layer failed, the server shut down): it cancels and awaits the
    background tasks and leaves the groups, tolerating a layer that is still down (the membership
    expires on its own, and a restarted Redis has none). Subclasses extend ``disconnect``.
    """

    accepted = False
    closing = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._groups: list[str] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._disconnected = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except OUTAGE_ERRORS as exc:
            first = str(exc).strip().splitlines()
            logger.warning(
                "websocket %s closed with %s, unavailable: %s: %s",
                scope.get("path", ""),
                CLOSE_TRY_AGAIN_LATER,
                type(exc).__name__,
                first[0] if first else "",
            )
            await self._close_for_outage()
        finally:
            await self._disconnect_once(CLOSE_TRY_AGAIN_LATER)

    async def accept(self, subprotocol: str | None = None, headers: Any = None) -> None:
        await super().accept(subprotocol, headers)
        self.accepted = True

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        self.closing = True
        await super().close(code=code, reason=reason)

    async def signed_in_user(self) -> Any:
        """The signed-in user, or None after closing with 4401 (every console socket needs one)."""
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return None
        return user

    async def join(self, group: str) -> None:
        """Receive the group's messages from now on; an outage raises (and closes with 1013)."""
        async with asyncio.timeout(LAYER_TIMEOUT_SECONDS):
            await self.channel_layer.group_add(group, self.channel_name)
        self._groups.append(group)

    def background(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task that lives as long as the connection (cancelled and awaited in ``disconnect``)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        return task

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        await self._disconnect_once(message.get("code", 1005))
        await aclose_old_connections()
        raise StopConsumer()

    async def disconnect(self, code: int) -> None:
        await self._stop_background()
        for group in self._groups:
            try:
                async with asyncio.timeout(LAYER_TIMEOUT_SECONDS):
                    await self.channel_layer.group_discard(group, self.channel_name)
            except OUTAGE_ERRORS as exc:
                logger.debug("leaving %s during an outage: %r", group, exc)
        self._groups.clear()

    async def _disconnect_once(self, code: int) -> None:
        if not self._disconnected:
            self._disconnected = True
            await self.disconnect(code)

    async def _stop_background(self) -> None:
        tasks, self._tasks = list(self._tasks), set()
        for task in tasks:
            task.cancel()
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, Exception):
                logger.debug("a websocket's background task ended with %r", result)

    async def _close_for_outage(self) -> None:
        """Accept if not yet (so the browser reads the code), then close with 1013."""
        await self._stop_background()  # nothing may send after the close
        try:
            if not self.accepted:
                await self.accept()
            if not self.closing:
                await self.close(code=CLOSE_TRY_AGAIN_LATER)
        except Exception as exc:  # the client left meanwhile: nothing to tell it
            logger.debug("closing a websocket during an outage: %r", exc)


class ForwardingJsonConsumer(LayerConsumer):
    """Base for consumers that push JSON to the browser and expect (almost) nothing back.

    Whatever a client sends is checked before it is parsed: binary frames, oversized frames and
    text that is not a JSON object (including JSON nested deeper than Python's parser can follow)
    end the connection with a close code saying why, never with an exception that drops the
    socket without a close frame. Subclasses handle well-formed objects in ``receive_message``.
    """

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
        user = await self.signed_in_user()
        if user is None:
            return
        await self.join(user_group(user.public_id))
        await self.accept()
        await self.send_json({"kind": "hello", "payload": {}})

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
