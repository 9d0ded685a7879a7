"""The simulated fleet's web apps (issue 19): what a tunnel of the ``sim`` driver answers.

A tunnel is one end of a socket pair; a thread serves the other end as a small HTTP/1.1 app,
clearly labelled simulated, so the embedded demo's Open buttons show something real through the
same proxy code as a real node: a page, Server-Sent Events (``events``), a download of any size
(``download?size=N``, generated, never held in memory), an upload that answers its sha256, and a
websocket that echoes. Nothing runs on the console's own host's shell or network.
"""

from __future__ import annotations

import hashlib
import html
import json
import socket
import threading
import time
from urllib.parse import parse_qs, urlsplit

import h11
from websockets.frames import Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol

CHUNK = 64 * 1024
MAX_DOWNLOAD = 1 << 31


def open_sim_tunnel(port: int, name: str) -> socket.socket:
    """One end of a socket pair; a daemon thread serves the other as the simulated app."""
    ours, theirs = socket.socketpair()
    thread = threading.Thread(
        target=_serve, args=(theirs, port, name), name=f"sim-web-{port}", daemon=True
    )
    thread.start()
    return ours


def _serve(sock: socket.socket, port: int, name: str) -> None:
    sock.settimeout(60)
    try:
        _App(sock, port, name).run()
    except (OSError, h11.ProtocolError):
        pass
    finally:
        sock.close()


class _App:
    def __init__(self, sock: socket.socket, port: int, name: str) -> None:
        self.sock, self.port, self.name = sock, port, name
        self.conn = h11.Connection(h11.SERVER)
        self.raw = bytearray()  # what came in, for a websocket's own parser

    def _next(self) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                data = self.sock.recv(CHUNK)
                if len(self.raw) < CHUNK:
                    self.raw += data
                self.conn.receive_data(data)
                continue
            return event

    def _send(self, *events: h11.Event) -> None:
        for event in events:
            data = self.conn.send(event)
            if data:
                self.sock.sendall(data)

    def run(self) -> None:
        event = self._next()
        if not isinstance(event, h11.Request):
            return
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in event.headers}
        target = event.target.decode("latin-1")
        if headers.get("upgrade", "").lower() == "websocket":
            self._websocket(event, target)
            return
        digest, size = hashlib.sha256(), 0
        while True:
            ev = self._next()
            if isinstance(ev, h11.Data):
                digest.update(ev.data)
                size += len(ev.data)
            elif isinstance(ev, h11.EndOfMessage | h11.ConnectionClosed):
                break
        path = urlsplit(target).path
        query = parse_qs(urlsplit(target).query)
        if event.method in (b"POST", b"PUT"):
            body = json.dumps({"simulated": True, "bytes": size, "sha256": digest.hexdigest()})
            self._answer(200, "application/json", body.encode())
        elif path.endswith("/events"):
            self._events()
        elif path.endswith("/download"):
            self._download(query)
        else:
            self._answer(200, "text/html; charset=utf-8", self._page(path).encode())

    def _answer(self, status: int, ctype: str, body: bytes) -> None:
        self._send(
            h11.Response(
                status_code=status,
                headers=[("Content-Type", ctype), ("Content-Length", str(len(body)))],
            ),
            h11.Data(data=body),
            h11.EndOfMessage(),
        )

    def _page(self, path: str) -> str:
        title = html.escape(f"{self.name} (simulated)")
        return (
            "<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{title}</title></head><body>"
            f"<h1 id='sim-app'>{title}</h1>"
            f"<p>This is the simulated fleet's stand-in for port {self.port}: a real node would "
            f"answer with the app the instance runs there (JupyterLab on 8888). "
            f"模拟集群：真实节点上这里是实例中运行的应用。</p>"
            f"<p>Path: <code>{html.escape(path)}</code></p>"
            "<ul><li><a href='events'>Server-Sent Events</a></li>"
            "<li><a href='download?size=1048576'>Download 1 MiB</a></li></ul>"
            "</body></html>"
        )

    def _events(self) -> None:
        self._send(
            h11.Response(
                status_code=200,
                headers=[("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")],
            )
        )
        for i in range(1, 6):
            self._send(h11.Data(data=f"data: simulated tick {i}\n\n".encode()))
            time.sleep(0.2)
        self._send(h11.EndOfMessage())

    def _download(self, query: dict[str, list[str]]) -> None:
        try:
            size = max(0, min(MAX_DOWNLOAD, int(query.get("size", ["0"])[0])))
        except ValueError:
            size = 0
        self._send(
            h11.Response(
                status_code=200,
                headers=[
                    ("Content-Type", "application/octet-stream"),
                    ("Content-Length", str(size)),
                ],
            )
        )
        block = bytes(range(256)) * (CHUNK // 256)
        left = size
        while left:
            piece = block[: min(left, CHUNK)]
            self._send(h11.Data(data=piece))
            left -= len(piece)
        self._send(h11.EndOfMessage())

    def _websocket(self, event: h11.Request, target: str) -> None:
        # The handshake is parsed again by the websocket protocol, from the bytes as they came.
        proto = ServerProtocol(max_size=None)
        proto.receive_data(bytes(self.raw))
        request = next(e for e in proto.events_received() if isinstance(e, Request))
        proto.send_response(proto.accept(request))
        self._flush(proto)
        while True:
            for frame in proto.events_received():
                if frame.opcode == Opcode.TEXT:
                    proto.send_text(b"simulated echo: " + frame.data)
                elif frame.opcode == Opcode.BINARY:
                    proto.send_binary(frame.data)
            self._flush(proto)
            if proto.close_expected() or proto.state.name == "CLOSED":
                return
            data = self.sock.recv(CHUNK)
            if not data:
                proto.receive_eof()
                self._flush(proto)
                return
            proto.receive_data(data)

    def _flush(self, proto: ServerProtocol) -> None:
        for data in proto.data_to_send():
            if data:
                self.sock.sendall(data)
