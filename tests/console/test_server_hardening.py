"""The real ASGI server process against bad input: static files, websocket paths and frames.

One embedded-default server (uvicorn, as `make demo` runs it) for the module. The websocket fuzz
sends generated paths and frames; every handshake answers below 500 and every accepted connection
ends with a close frame carrying a code (no 1006 "closed without a close frame"). The generator is
seeded: ``WS_FUZZ_SEED`` reproduces a run, ``WS_FUZZ_CASES`` sets its size.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import uuid
from collections import Counter
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
import websockets

from tests.support import servers

OPS_PASSWORD = "ops-password-for-hardening-1"
WS_FUZZ_CASES = int(os.environ.get("WS_FUZZ_CASES", "200"))
WS_FUZZ_SEED = int(os.environ.get("WS_FUZZ_SEED", str(random.SystemRandom().randrange(2**32))))
DEEP_JSON = '{"a":' * 1000 + "1" + "}" * 1000


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Stack]:
    tmp = tmp_path_factory.mktemp("hardening")
    env = servers.embedded_env(tmp)
    env["STATE_DIR"] = str(tmp / "state")
    servers.migrate(env)
    servers.create_superuser(env, "ops", OPS_PASSWORD)
    web = servers.Stack(env=env, port=servers.free_port(), tmp=tmp)
    try:
        web.start_web()
        yield web
    finally:
        web.stop()


def _cookie(stack: servers.Stack) -> str:
    client = httpx.Client(base_url=stack.url, timeout=10)
    servers.login(client, "ops", OPS_PASSWORD)
    return "; ".join(f"{k}={v}" for k, v in client.cookies.items())


def test_static_files_are_served_under_asgi_without_the_sync_iterator_warning(stack) -> None:
    source = servers.ROOT / "static" / "console" / "console.js"
    response = httpx.get(f"{stack.url}/static/console/console.js", timeout=10)
    assert response.status_code == 200
    assert response.content == source.read_bytes()
    assert response.headers["content-type"].startswith("text/javascript")
    assert int(response.headers["content-length"]) == source.stat().st_size
    head = httpx.head(f"{stack.url}/static/console/console.js", timeout=10)
    assert head.status_code == 200 and head.content == b""
    again = httpx.get(
        f"{stack.url}/static/console/console.js",
        headers={"If-None-Match": response.headers["etag"]},
        timeout=10,
    )
    assert again.status_code == 304
    log = stack.logs()
    assert "StreamingHttpResponse must consume" not in log, log
    assert "Traceback" not in log, log


async def _close_code(
    stack: servers.Stack, path: str, cookie: str, frames: list[str | bytes], wait: float = 5
) -> int | str:
    """The close code the server ended the connection with, or "http <status>" if refused.

    A connection the server keeps open for ``wait`` seconds is closed by us ("open"), and must
    still answer our close frame.
    """
    headers = {"Cookie": cookie, "Origin": stack.url}
    try:
        async with websockets.connect(
            f"ws://127.0.0.1:{stack.port}{path}",
            additional_headers=headers,
            max_size=None,
            open_timeout=10,
            close_timeout=5,
        ) as ws:
            for frame in frames:
                try:
                    await ws.send(frame)
                except websockets.ConnectionClosed:
                    break
            kept_open = False
            try:
                async with asyncio.timeout(wait):
                    async for _message in ws:
                        pass  # hello, then the server closes
            except websockets.ConnectionClosed:
                pass  # closed with an error code: read below
            except TimeoutError:
                kept_open = True
                await ws.close()
    except websockets.InvalidStatus as refused:
        return f"http {refused.response.status_code}"
    rcvd = ws.protocol.close_rcvd
    if rcvd is None:
        return 1006  # the connection ended without a close frame from the server
    return "open" if kept_open else rcvd.code


def test_unknown_websocket_path_and_bad_frames_close_with_a_code(stack) -> None:
    cookie = _cookie(stack)
    cases: list[tuple[str, list[str | bytes], int]] = [
        ("/ws/nope/", [], 4404),
        ("/ws/", [], 4404),
        ("/ws/notifications/", ["not json"], 4400),
        ("/ws/notifications/", [DEEP_JSON], 4400),
        ("/ws/notifications/", [b"\x00\xffbinary"], 1003),
        ("/ws/notifications/", ["x" * (1024 * 1024)], 1009),
    ]

    async def run() -> list[tuple[str, int | str, int]]:
        return [
            (path, await _close_code(stack, path, cookie, frames), want)
            for path, frames, want in cases
        ]

    for path, got, want in servers.run_async(run()):
        assert got == want, (path, got, want, stack.logs())
    assert "Traceback" not in stack.logs(), stack.logs()


def _fuzz_case(rng: random.Random) -> tuple[str, list[str | bytes]]:
    alphabet = "abcXYZ019-_./%~:@!$&'()*+,;=?#[]\\ 中文\u202e\u200b"
    roll = rng.random()
    if roll < 0.4:
        path = "/ws/notifications/"
    elif roll < 0.5:  # an instance that does not exist (or is someone else's): refused, no 500
        path = f"/ws/instances/{uuid.UUID(int=rng.getrandbits(128))}/"
    else:
        path = "/" + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        if rng.random() < 0.5:
            path = "/ws/" + path.lstrip("/")
        path = quote(path, safe="/%:@!$&'()*+,;=~")  # what a client can put on the wire
    pool: list[str | bytes] = [
        DEEP_JSON,
        "[" * rng.randint(1, 200_000),
        json.dumps({"kind": "ping", "payload": {"n": rng.random()}}),
        json.dumps(["not", "an", "object"]),
        "x" * rng.choice([0, 1, 65 * 1024, 1024 * 1024]),
        "".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(1, 300))),
        rng.randbytes(rng.randint(0, 2048)),
        "null",
        '{"kind": ' + "9" * 5000 + "}",
    ]
    frames = [rng.choice(pool) for _ in range(rng.randint(0, 3))]
    return path, frames


def test_websocket_fuzz_sees_no_server_error_and_always_a_close_frame(stack) -> None:
    cookie = _cookie(stack)
    rng = random.Random(WS_FUZZ_SEED)
    cases = [_fuzz_case(rng) for _ in range(WS_FUZZ_CASES)]

    async def run() -> list[int | str]:
        return [await _close_code(stack, path, cookie, frames, wait=1) for path, frames in cases]

    outcomes = servers.run_async(run())
    seen = Counter(outcomes)
    bad = [
        (path, [f[:40] for f in frames], got)
        for (path, frames), got in zip(cases, outcomes, strict=True)
        if got == 1006 or (isinstance(got, str) and got.startswith("http 5"))
    ]
    print(
        f"websocket fuzz: {len(cases)} cases (WS_FUZZ_SEED={WS_FUZZ_SEED}), outcomes {dict(seen)}"
    )
    assert not bad, f"WS_FUZZ_SEED={WS_FUZZ_SEED}: {bad[:10]}"
    assert "Traceback" not in stack.logs(), f"WS_FUZZ_SEED={WS_FUZZ_SEED}\n{stack.logs()}"
    assert seen[4404] and seen[1003] and seen[4400]  # the run reached each kind of refusal


def _post_until_answered(
    stack: servers.Stack, path: str, total: int, *, declared: bool
) -> tuple[bytes, int]:
    """POST ``total`` bytes to the real server in 64 KiB pieces (chunked, or with a
    Content-Length), stopping as soon as it answers: its answer and the bytes sent until then."""
    import select
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(stack.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=30)
    framing = f"Content-Length: {total}" if declared else "Transfer-Encoding: chunked"
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {url.hostname}:{url.port}\r\n{framing}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\nAccept-Language: en\r\n\r\n".encode()
    )
    piece = b"x" * 65536
    sent = 0
    answer = b""
    try:
        while sent < total:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            sock.sendall(piece if declared else b"10000\r\n" + piece + b"\r\n")
            sent += len(piece)
    except (BrokenPipeError, ConnectionResetError):
        pass
    sock.settimeout(30)
    try:
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and b"</p>" in answer:
                break
    except (ConnectionResetError, TimeoutError):
        pass
    sock.close()
    return answer, sent


def test_an_anonymous_300_mb_chunked_post_to_sign_in_is_refused_without_being_received(
    stack,
) -> None:
    """Issue 29: the body is capped by route before Django reads it, chunked included."""
    answer, sent = _post_until_answered(stack, "/accounts/login/", 300 * 1024**2, declared=False)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"The request body is larger than 65536 bytes." in answer
    assert sent < 64 * 1024**2, sent  # the server stopped reading long before 300 MB
    answer, sent = _post_until_answered(stack, "/accounts/login/", 300 * 1024**2, declared=True)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < 64 * 1024**2, sent
    # The server still answers.
    assert httpx.get(f"{stack.url}/accounts/login/", timeout=10).status_code == 200
    assert "Traceback" not in stack.logs()
