"""The web server runs without permessage-deflate: compressing every watcher's copy of a cluster's
heat-map frame (23 KiB a second for 2,048 GPUs) cost the web server more than the bytes it saved
were worth (bench/telemetry.py measures both in one run). The Procfile's web process and the
Makefile's serve and demo commands say so, and uvicorn run with their options agrees to no
compression when a browser offers it."""

from __future__ import annotations

import asyncio
import re
import shlex
import threading
import time
from pathlib import Path

import pytest
import uvicorn
import websockets
from websockets.asyncio.client import ClientConnection

from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
APP = "console.asgi:application"


def _procfile_web() -> list[str]:
    line = next(x for x in (ROOT / "Procfile").read_text().splitlines() if x.startswith("web:"))
    # ${NAME:-default} -> default (what the shell gives without the variable)
    line = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", line.removeprefix("web:"))
    return shlex.split(line)


def _makefile(target: str) -> list[str]:
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = lines.index(next(x for x in lines if x.startswith(f"{target}:")))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    command = next(x for x in recipe if APP in x)
    command = command.replace("$(HOST)", "127.0.0.1").replace("$(PORT)", "8000")
    return shlex.split(command)


def _options(argv: list[str]) -> dict[str, object]:
    """What uvicorn's own command line makes of ``argv`` (its parser, not ours)."""
    assert argv[0].endswith("uvicorn"), argv
    return uvicorn.main.make_context("uvicorn", argv[1:]).params


@pytest.mark.parametrize(
    "argv",
    [_procfile_web(), _makefile("serve"), _makefile("demo")],
    ids=["Procfile web", "make serve", "make demo"],
)
def test_the_shipped_server_commands_turn_permessage_deflate_off(argv: list[str]) -> None:
    options = _options(argv)
    assert options["app"] == APP
    assert options["ws_per_message_deflate"] is False


async def _app(scope, receive, send) -> None:  # noqa: ANN001
    """A websocket that sends one large, compressible frame."""
    assert scope["type"] == "websocket"
    await receive()
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": "0123456789abcdef" * 1500})
    await send({"type": "websocket.close", "code": 1000})


class _Counting(ClientConnection):
    """Counts the bytes that arrive (the handshake's answer and the frame)."""

    wire = 0

    def data_received(self, data: bytes) -> None:
        self.wire += len(data)
        super().data_received(data)


def _handshake(ws_per_message_deflate: bool) -> tuple[str | None, int]:
    """Serve ``_app`` with that option; a client offering deflate: the extension the server
    agreed to, and the bytes that arrived (the handshake's answer and the frame)."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            _app,
            host="127.0.0.1",
            port=port,
            lifespan="off",
            log_level="warning",
            ws_per_message_deflate=ws_per_message_deflate,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)

        async def client() -> tuple[str | None, int]:
            async with websockets.connect(
                f"ws://127.0.0.1:{port}/", compression="deflate", create_connection=_Counting
            ) as ws:
                agreed = ws.response.headers.get("Sec-WebSocket-Extensions")
                text = await ws.recv()
                assert text == "0123456789abcdef" * 1500
                return agreed, ws.wire  # type: ignore[attr-defined]

        return asyncio.run(client())
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def test_uvicorn_so_run_sends_uncompressed_frames_to_a_browser_offering_deflate() -> None:
    off = _options(_procfile_web())["ws_per_message_deflate"]
    agreed, wire = _handshake(bool(off))
    assert agreed is None
    assert wire >= 24_000  # the frame as the application gave it
    # The same client and frame with uvicorn's default: compressed (what browsers got before).
    agreed, wire = _handshake(True)
    assert agreed is not None and agreed.startswith("permessage-deflate")
    assert wire < 2_000


@pytest.mark.parametrize(
    "argv",
    [_procfile_web(), _makefile("serve"), _makefile("demo")],
    ids=["Procfile web", "make serve", "make demo"],
)
def test_the_shipped_server_commands_bound_a_websocket_frame(argv: list[str]) -> None:
    """Issue 29: while a terminal's input is full the server holds the frames it already read
    (``--ws-max-queue``, 32); each at most 256 KiB (a 64 Ki-character frame in UTF-8, the
    consumers' own limit), not uvicorn's default 16 MiB."""
    from console.consumers import MAX_FRAME_CHARS

    options = _options(argv)
    assert 4 * MAX_FRAME_CHARS <= options["ws_max_size"] <= 256 * 1024
    assert options["ws_max_queue"] <= 32
