"""The gateway's port forwarder (issue 29): each instance's public SSH port, kept for the
instance's whole life, to wherever its sshd runs now.

Standard library only: the operator copies this one file to the region's gateway and runs it
there (a systemd unit, see the README)::

    python3 gateway_forward.py --routes /etc/gpc-gateway/routes [--bind 0.0.0.0]

The console writes the routes file (``slices.drivers.gateway.routes_file``) beside the gateway's
keys file on every change, atomically (a rename), one line per running instance::

    40017 10.11.1.3 30211 gpc-6f3a2b1c

The forwarder looks at the file every ``--interval`` seconds: a new port is listened on, a port
whose destination changed (the instance started elsewhere, or was migrated) sends its next
connections to the new place, a port that left the file (the instance stopped or was released)
is closed, and its open connections with it. Bytes are relayed as they are: authentication is the
instance's own sshd's (the customer's key only), so a port reaches that one sshd and nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable

logger = logging.getLogger("gateway_forward")
CHUNK = 64 * 1024
CONNECT_TIMEOUT = 10.0


def parse_routes(text: str) -> dict[int, tuple[str, int]]:
    """``port address dest_port [label]`` lines -> {port: (address, dest_port)}; anything else
    (comments, a half-written line) is skipped. The same rules as the console's writer."""
    out: dict[int, tuple[str, int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or line.lstrip().startswith("#"):
            continue
        try:
            port, dest = int(parts[0]), int(parts[2])
        except ValueError:
            continue
        if 0 < port < 65536 and 0 < dest < 65536:
            out[port] = (parts[1], dest)
    return out


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


class Forwarder:
    """The listening ports and their destinations, kept equal to the routes file."""

    def __init__(self, routes_path: str, bind: str) -> None:
        self.routes_path = routes_path
        self.bind = bind
        self.routes: dict[int, tuple[str, int]] = {}
        self.servers: dict[int, asyncio.Server] = {}
        self.conns: dict[int, set[asyncio.Task[None]]] = {}
        self._stamp: tuple[int, int] | None = None

    def read(self) -> dict[int, tuple[str, int]] | None:
        """The file's routes when it changed since the last look; None when it did not (or is
        missing: the routes stay as they were until the console writes it)."""
        try:
            st = os.stat(self.routes_path)
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_ino)
        if stamp == self._stamp:
            return None
        try:
            with open(self.routes_path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            return None
        self._stamp = stamp
        return parse_routes(text)

    async def apply(self, routes: dict[int, tuple[str, int]]) -> None:
        for port in sorted(set(self.servers) - set(routes)):
            await self._close(port)
            logger.info("port %d closed", port)
        for port, dest in sorted(routes.items()):
            if self.routes.get(port) != dest and port in self.servers:
                logger.info("port %d now goes to %s:%d", port, *dest)
            self.routes[port] = dest
            if port not in self.servers:
                try:
                    self.servers[port] = await asyncio.start_server(
                        self._acceptor(port), self.bind, port
                    )
                except OSError as exc:
                    logger.warning("port %d: cannot listen: %s", port, exc)
                    continue
                logger.info("port %d listens, to %s:%d", port, *dest)

    async def _close(self, port: int) -> None:
        server = self.servers.pop(port, None)
        self.routes.pop(port, None)
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()
        for task in self.conns.pop(port, set()):
            task.cancel()

    def _acceptor(self, port: int) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], None]:
        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._accept(port, reader, writer)

        return accept

    def _accept(
        self, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.ensure_future(self._relay(port, reader, writer))
        self.conns.setdefault(port, set()).add(task)
        task.add_done_callback(lambda t: self.conns.get(port, set()).discard(t))

    async def _relay(
        self, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        dest = self.routes.get(port)
        try:
            if dest is None:
                return
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(*dest), CONNECT_TIMEOUT
                )
            except (TimeoutError, OSError) as exc:
                logger.info("port %d: %s:%d does not answer: %s", port, *dest, exc)
                return
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                up_writer.close()
        finally:
            writer.close()

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            routes = self.read()
            if routes is not None:
                await self.apply(routes)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
        for port in list(self.servers):
            await self._close(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routes", default="/etc/gpc-gateway/routes")
    parser.add_argument("--bind", default="0.0.0.0")  # noqa: S104 - the gateway's public door
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await Forwarder(args.routes, args.bind).run(max(0.05, args.interval), stop)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
