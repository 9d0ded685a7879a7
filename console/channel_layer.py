"""The embedded default's channel layer: the in-memory layer, made safe across event loops.

The in-memory layer keeps an ``asyncio.Queue`` per channel, bound to the server's event loop. The
embedded Celery worker runs tasks in threads; ``async_to_sync(layer.group_send)`` there runs on a
private loop, and putting into a queue that belongs to another loop neither is thread-safe nor wakes
the consumer waiting on it. So every mutating call made from a foreign loop is handed over to the
server loop with ``run_coroutine_threadsafe`` and awaited from there. Production uses channels-redis,
where none of this applies; tasks and consumers are the same code in both modes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.layers import InMemoryChannelLayer


class EmbeddedChannelLayer(InMemoryChannelLayer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._home_loop: asyncio.AbstractEventLoop | None = None

    def _foreign_home(self) -> asyncio.AbstractEventLoop | None:
        """The server loop if we are running on another loop (a worker thread), else None."""
        home = self._home_loop
        if home is None or home.is_closed() or not home.is_running():
            return None
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        return None if current is home else home

    async def _on_home(self, coro: Any) -> Any:
        home = self._foreign_home()
        if home is None:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, home))

    async def receive(self, channel: str) -> dict:
        # Consumers receive on the server loop: remember it as the home of every queue.
        self._home_loop = asyncio.get_running_loop()
        return await super().receive(channel)

    async def send(self, channel: str, message: dict) -> None:
        await self._on_home(super().send(channel, message))

    async def group_add(self, group: str, channel: str) -> None:
        await self._on_home(super().group_add(group, channel))

    async def group_discard(self, group: str, channel: str) -> None:
        await self._on_home(super().group_discard(group, channel))

    async def group_send(self, group: str, message: dict) -> None:
        await self._on_home(super().group_send(group, message))
