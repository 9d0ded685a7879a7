"""In-process websocket connections through asgiref's ``ApplicationCommunicator`` (what Channels'
``WebsocketCommunicator`` does; its package needs daphne, which we do not install)."""

from __future__ import annotations

from typing import Any

from asgiref.testing import ApplicationCommunicator


def websocket_scope(
    path: str, *, headers: list[tuple[bytes, bytes]] | None = None, **extra: Any
) -> dict[str, Any]:
    """The ASGI scope of a websocket handshake on ``path``; ``extra`` adds keys (``user``,
    ``client``, ``server``)."""
    return {
        "type": "websocket",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers or [],
        "subprotocols": [],
        **extra,
    }


class WebsocketCommunicator(ApplicationCommunicator):
    """An ``ApplicationCommunicator`` that, like an ASGI server, answers the application's
    ``websocket.close`` with ``websocket.disconnect``: the connection is gone, so the application
    returns. Without it a refused handshake's consumer waits for a message that never comes, and
    ``wait()`` gives up only at its timeout (5 s per refusal), silently."""

    async def receive_output(self, timeout: float = 1) -> dict[str, Any]:
        message = await super().receive_output(timeout)
        if message.get("type") == "websocket.close" and not self.future.done():
            await self.send_input(
                {"type": "websocket.disconnect", "code": message.get("code", 1000)}
            )
        return message


async def open_websocket(
    app: Any, scope: dict[str, Any]
) -> tuple[ApplicationCommunicator, dict[str, Any]]:
    """Send the handshake to ``app``; the communicator and the first message back (an accept, or
    the close of a refusal)."""
    communicator = WebsocketCommunicator(app, scope)
    await communicator.send_input({"type": "websocket.connect"})
    first = await communicator.receive_output(timeout=5)
    return communicator, first
