"""The port proxy's relay (issue 19): HTTP/1.1 and websockets spoken over a driver ``Tunnel`` (a
paramiko ``direct-tcpip`` channel, or the sim driver's socket), from the event loop.

No Django, no models: ``slices.port_views`` checks access (``slices.services.ports``), opens the
tunnel and hands it here. Everything streams: a request body goes out as it is read, a response
(a 100 MB download, Server-Sent Events) comes back chunk by chunk, never whole in memory; the
tunnel is waited on with ``loop.add_reader`` on its file descriptor, so a slow stream holds no
thread. HTTP is parsed by h11 (uvicorn's own parser), websockets by the ``websockets`` sans-I/O
client; the bytes between them are the tunnel's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import h11
from websockets.client import ClientProtocol
from websockets.frames import Opcode
from websockets.uri import parse_uri

CHUNK = 256 * 1024
# Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), and the ones we set.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
_SET_BY_US = frozenset({"host", "content-length", "x-forwarded-prefix"})


class TunnelClosed(Exception):  # noqa: N818 - the event, like ConnectionResetError
    pass


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


class AsyncTunnel:
    """A driver's ``Tunnel`` used from the event loop: non-blocking, woken by its descriptor."""

    def __init__(self, tunnel: Any) -> None:
        self.tunnel = tunnel
        tunnel.settimeout(0.0)
        self.fd = tunnel.fileno()
        self.closed = False

    async def recv(self, size: int = CHUNK) -> bytes:
        """Up to ``size`` bytes; b"" at the end of the stream."""
        while True:
            if self.closed:
                return b""
            try:
                return bytes(self.tunnel.recv(size))
            except (TimeoutError, BlockingIOError, InterruptedError):
                await _readable(self.fd)
            except OSError:
                return b""

    async def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.closed:
                raise TunnelClosed
            try:
                sent = self.tunnel.send(bytes(view[:CHUNK]))
            except (TimeoutError, BlockingIOError, InterruptedError):
                sent = 0  # the SSH window or the socket buffer is full: let the peer read
            except OSError as exc:
                raise TunnelClosed from exc
            if sent:
                view = view[sent:]
            else:
                if getattr(self.tunnel, "closed", False):
                    raise TunnelClosed
                await asyncio.sleep(0.002)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.tunnel.close()


# ---------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------


@dataclass
class UpstreamResponse:
    status: int
    headers: list[tuple[str, str]]  # as the app sent them, hop-by-hop ones removed
    body: AsyncIterator[bytes]


def forward_headers(
    headers: Iterable[tuple[str, str]],
    *,
    drop_cookies: frozenset[str],
    extra: Iterable[tuple[str, str]] = (),
) -> list[tuple[str, str]]:
    """The request's headers for the app: no hop-by-hop ones, none we set, and the Cookie header
    without the console's own cookies (the app never sees the console's session)."""
    out: list[tuple[str, str]] = []
    for name, value in headers:
        low = name.lower()
        if low in HOP_BY_HOP or low in _SET_BY_US:
            continue
        if low == "cookie":
            kept = [
                part.strip()
                for part in value.split(";")
                if part.strip() and part.split("=", 1)[0].strip() not in drop_cookies
                and not part.split("=", 1)[0].strip().startswith("gpc_")
            ]  # fmt: skip
            if not kept:
                continue
            value = "; ".join(kept)
        out.append((name, value))
    out.extend(extra)
    return out


async def http_request(
    tunnel: AsyncTunnel,
    *,
    method: str,
    target: str,
    host: str,
    headers: list[tuple[str, str]],
    body: AsyncIterator[bytes] | None,
    content_length: int | None,
) -> UpstreamResponse:
    """Send one request over ``tunnel`` (``Connection: close``) and return the response with
    its body as a stream; the tunnel is closed when the body ends or the stream is dropped."""
    conn = h11.Connection(h11.CLIENT)
    hdrs = [("Host", host), *headers, ("Connection", "close")]
    if content_length is not None:
        hdrs.append(("Content-Length", str(content_length)))
    elif body is not None:
        hdrs.append(("Transfer-Encoding", "chunked"))
    try:
        # The head, and the body while it is small, go out in one write: a second small SSH
        # packet would wait for the node's delayed acknowledgement (Nagle, ~40 ms).
        pending = bytearray(conn.send(h11.Request(method=method, target=target, headers=hdrs)))
        if body is not None:
            async for chunk in body:
                if chunk:
                    pending += conn.send(h11.Data(data=chunk)) or b""
                    if len(pending) >= CHUNK:
                        await tunnel.sendall(bytes(pending))
                        pending.clear()
        pending += conn.send(h11.EndOfMessage()) or b""
        await tunnel.sendall(bytes(pending))
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await tunnel.recv())
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                break
            raise TunnelClosed(f"unexpected {event!r}")
    except (h11.ProtocolError, TunnelClosed):
        tunnel.close()
        raise TunnelClosed from None
    except BaseException:
        tunnel.close()
        raise
    headers_out = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in event.headers
        if k.decode("latin-1").lower() not in HOP_BY_HOP
    ]

    async def stream() -> AsyncIterator[bytes]:
        try:
            while True:
                ev = conn.next_event()
                if ev is h11.NEED_DATA:
                    conn.receive_data(await tunnel.recv())
                    continue
                if isinstance(ev, h11.Data):
                    yield bytes(ev.data)
                elif isinstance(ev, h11.EndOfMessage | h11.ConnectionClosed):
                    return
        except h11.ProtocolError:
            return  # the app hung up mid-body: what was sent is what there is
        finally:
            tunnel.close()

    return UpstreamResponse(event.status_code, headers_out, stream())


# ---------------------------------------------------------------------------------------------
# Websockets
# ---------------------------------------------------------------------------------------------


class UpstreamWebsocket:
    """A websocket client over a tunnel (the ``websockets`` sans-I/O protocol)."""

    def __init__(self, tunnel: AsyncTunnel) -> None:
        self.tunnel = tunnel
        self.proto: ClientProtocol | None = None
        self.subprotocol: str | None = None
        self._parts: list[bytes] = []
        self._opcode: Opcode | None = None
        # One writer at a time: a message several SSH windows long goes out in pieces, waiting
        # for the window between them, and a pong written meanwhile would land inside it.
        self._writing = asyncio.Lock()
        self._answering: asyncio.Task[None] | None = None
        self._pending: list[Any] = []

    async def connect(
        self, authority: str, target: str, headers: list[tuple[str, str]], subprotocols: list[str]
    ) -> bool:
        """The handshake (Host: ``authority``, as the app knows itself); whether it accepted."""
        path = target if target.startswith("/") else "/" + target
        uri = parse_uri(f"ws://{authority}{path}")
        self.proto = ClientProtocol(uri, subprotocols=subprotocols or None, max_size=None)  # type: ignore[arg-type]
        request = self.proto.connect()
        for name, value in headers:
            if name.lower() in ("sec-websocket-protocol", "sec-websocket-extensions"):
                continue
            request.headers[name] = value
        self.proto.send_request(request)
        await self._flush()
        while self.proto.handshake_exc is None and self.proto.state.name == "CONNECTING":
            data = await self.tunnel.recv()
            if not data:
                self.proto.receive_eof()
                break
            self.proto.receive_data(data)
        # The first event is the handshake's response; frames after it stay queued.
        self._pending = list(self.proto.events_received())
        if self.proto.state.name != "OPEN":
            self.tunnel.close()
            return False
        self.subprotocol = self.proto.subprotocol
        return True

    async def _flush(self) -> None:
        """Write what the protocol has to send, whole frames in order, one writer at a time."""
        assert self.proto is not None
        async with self._writing:
            while chunks := self.proto.data_to_send():
                for data in chunks:
                    if data:
                        await self.tunnel.sendall(data)

    def _answer(self) -> None:
        """Pongs, written without holding up the reading: the app keeps being read while a long
        message of the browser's is still going out."""
        if self._answering is None or self._answering.done():
            self._answering = asyncio.create_task(self._flush_quietly())

    async def _flush_quietly(self) -> None:
        with contextlib.suppress(TunnelClosed, OSError):
            await self._flush()  # a closed tunnel ends the reading too, which says so

    async def send(self, text: str | None, data: bytes | None) -> None:
        assert self.proto is not None
        if self.proto.state.name != "OPEN":
            return
        if text is not None:
            self.proto.send_text(text.encode())
        elif data is not None:
            self.proto.send_binary(data)
        await self._flush()

    async def messages(self) -> AsyncIterator[tuple[str | None, bytes | None]]:
        """Each whole message from the app: (text, None) or (None, bytes), until it closes."""
        assert self.proto is not None
        events: list[Any] = [e for e in self._pending if hasattr(e, "opcode")]
        while True:
            for frame in events:
                message = self._assemble(frame)
                if message is not None:
                    yield message
            if self.proto.state.name == "CLOSED" or self.proto.close_expected():
                with contextlib.suppress(TunnelClosed, OSError):
                    await self._flush()  # the closing handshake's answer
                return
            if any(frame.opcode == Opcode.PING for frame in events):
                self._answer()
            data = await self.tunnel.recv()
            if not data:
                self.proto.receive_eof()
                return
            self.proto.receive_data(data)
            events = list(self.proto.events_received())

    def _assemble(self, frame: Any) -> tuple[str | None, bytes | None] | None:
        if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
            self._opcode, self._parts = frame.opcode, [bytes(frame.data)]
        elif frame.opcode == Opcode.CONT:
            self._parts.append(bytes(frame.data))
        else:
            return None  # ping, pong, close: the protocol answers them
        if not frame.fin:
            return None
        data = b"".join(self._parts)
        self._parts = []
        if self._opcode == Opcode.TEXT:
            return data.decode("utf-8", "replace"), None
        return None, data

    async def close(self) -> None:
        if self.proto is not None and self.proto.state.name == "OPEN":
            with contextlib.suppress(TunnelClosed, OSError):
                self.proto.send_close(1000)
                await self._flush()
        if self._answering is not None:
            self._answering.cancel()
        self.tunnel.close()
