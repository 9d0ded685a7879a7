"""A lean HTTP/1.1 keep-alive client for the load generator's many API pollers.

bench/load.py runs every simulated user in one Python process on the machine it measures, so the
generator's CPU is taken from the stack under test. httpx spends about a millisecond of CPU per
request (its models, hooks and state machine); this client, one connection and one request at a
time, plain HTTP only, a fraction of that: a request written in one ``write``, the status line and
headers read in one ``readuntil``, the body by ``Content-Length`` or chunked. Enough for the API's
answers; not a general client (no redirects, cookies, TLS or pipelining).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import urlsplit


class ConnectionLost(Exception):
    """The server closed the connection before the whole answer came (a kept-alive connection it
    had closed meanwhile, or a reset): for a GET, sending it again is safe."""


class Response:
    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    def json(self) -> Any:
        return json.loads(self.content)


class LeanClient:
    """``async with LeanClient(url, headers=...) as client: await client.request("GET", path)``."""

    def __init__(
        self, base_url: str, headers: dict[str, str] | None = None, timeout: float = 30.0
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"LeanClient speaks plain http only, not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.timeout = timeout
        fixed = {"Host": parts.netloc, "User-Agent": "bench-load", "Accept": "*/*"}
        fixed.update(headers or {})
        self._head = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def request(
        self, method: str, path: str, *, headers: dict[str, str] | None = None, json: Any = None
    ) -> Response:
        body = b"" if json is None else _dumps(json)
        head = f"{method} {path} HTTP/1.1\r\n{self._head}"
        if headers:
            head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        if body or method not in ("GET", "HEAD"):
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        message = (head + "\r\n").encode("latin-1") + body
        async with asyncio.timeout(self.timeout):
            try:
                return await self._exchange(message, method)
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                await self.aclose()
                raise ConnectionLost(repr(exc)) from exc
            except BaseException:
                await self.aclose()  # a timeout or a cancel mid-answer: the connection is unusable
                raise

    async def _exchange(self, message: bytes, method: str) -> Response:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        writer.write(message)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            content = b""
        elif "content-length" in headers:
            content = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            content = await _chunked(reader)
        else:  # the body runs to the end of the connection
            content = await reader.read()
            headers["connection"] = "close"
        if headers.get("connection", "").lower() == "close":
            await self.aclose()
        return Response(status, headers, content)


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers are sent to this client
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
