"""The production edge in tests (issue 34): the console served by uvicorn in a thread of this
process (against the test database, as tests/e2e's ``console_url``) and Debian's nginx in front
of it, rendered by ``console.edge`` and run unprivileged with its own pid, logs and temporary
files under a folder of the test's."""

from __future__ import annotations

import dataclasses
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from tests.support import servers


def asgi_app() -> Any:
    from channels.auth import AuthMiddlewareStack
    from channels.routing import ProtocolTypeRouter
    from django.core.asgi import get_asgi_application

    from console.routing import OriginValidator, websocket_router
    from slices.port_views import AppHostRouter

    return AppHostRouter(
        ProtocolTypeRouter(
            {
                "http": get_asgi_application(),
                "websocket": OriginValidator(AuthMiddlewareStack(websocket_router())),
            }
        )
    )


def recording(app: Any, seen: list[tuple[str, int]]) -> Any:
    """``app``, noting each HTTP request's path and the client's port (which connection of
    nginx's it came on) in ``seen``."""

    async def record(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("client"):
            seen.append((scope["path"], int(scope["client"][1])))
        await app(scope, receive, send)

    return record


@contextmanager
def console_in_thread(seen: list[tuple[str, int]] | None = None) -> Iterator[int]:
    """uvicorn serving the console in a thread; its port. With ``seen``, each request's path
    and client port are noted there."""
    port = servers.free_port()
    app = asgi_app()
    config = uvicorn.Config(
        app if seen is None else recording(app, seen),
        host="127.0.0.1",
        port=port,
        lifespan="off",
        log_level="warning",
        ws="websockets-sansio",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="edge-console", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not listen on {port}") from None
            time.sleep(0.05)


@dataclass
class Edge:
    port: int
    prefix: Path
    static_root: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def error_log(self) -> str:
        path = self.prefix / "logs" / "error.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def short_dir() -> Path:
    """A folder with a short path (a unix socket's path has at most 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix="gpce", dir="/tmp"))


@contextmanager
def nginx_in_front(web: list[str], prefix: Path, static_root: Path) -> Iterator[Edge]:
    """nginx rendered from the settings by ``console.edge``, listening on a free loopback port in
    front of ``web``; stopped (its pid only) on exit."""
    from console import edge

    port = servers.free_port()
    opts = dataclasses.replace(
        edge.options(f"127.0.0.1:{port}", tuple(web), workers="2", access_log=True),
        prefix=prefix,
        static_root=static_root,
    )
    conf = edge.write(opts)
    log = (prefix / "logs" / "nginx.out").open("wb")
    proc = subprocess.Popen(
        edge.command(conf, prefix), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_port(port, proc)
        yield Edge(port, prefix, static_root, proc)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def cleanup(prefix: Path) -> None:
    from slices.drivers.ssh import edge as ssh_edge

    ssh_edge.close_all(prefix / "tunnels")
    shutil.rmtree(prefix, ignore_errors=True)


def wait_port_plain(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {port}") from None
            time.sleep(0.1)


@contextmanager
def files_instance(
    settings: Any,
    ssh_hosts: Any,
    tmp_path: Path,
    owner: Any,
    capture: Any,
    *,
    size: int,
    name: str,
) -> Iterator[tuple[Any, int, str]]:
    """A running instance on an sshd test host whose launch command serves a folder with a
    ``size``-byte file ``big.bin`` on a declared web port (``python3 -m http.server``): the
    instance, the port and the file's sha256; released after."""
    import hashlib
    import os
    import shlex
    import sys

    from slices import services
    from slices.choices import InstanceState
    from slices.models import Instance, Node
    from tests.slices.factories import load_small_fleet, run_order
    from tests.support.sshd import configure_ssh_fleet

    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SSH_CONNECT_TIMEOUT = 5.0
    settings.SLICES_SSH_COMMAND_TIMEOUT = 60.0
    load_small_fleet()
    nodes = list(Node.objects.filter(gpu_model__code="RTX4090").order_by("hostname"))
    configure_ssh_fleet(
        settings, ssh_hosts.get(1), nodes, tmp_path, client_key=ssh_hosts.client_key
    )
    files = tmp_path / "files"
    files.mkdir()
    digest = hashlib.sha256()
    block = os.urandom(1024 * 1024)
    with (files / "big.bin").open("wb") as out:
        for i in range(size // len(block)):
            chunk = bytes([i % 256]) + block[1:]
            out.write(chunk)
            digest.update(chunk)
    port = servers.free_port()
    entrypoint = (
        f"exec {shlex.quote(sys.executable)} -m http.server {port} --bind 127.0.0.1 "
        f"--directory {shlex.quote(str(files))}"
    )
    instance = run_order(
        owner,
        capture,
        cards=1,
        name=name,
        entrypoint=entrypoint,
        web_ports=({"port": port, "name": "files"},),
    )
    assert instance.state == InstanceState.RUNNING, list(
        instance.events.values_list("code", "text")
    )
    wait_port_plain(port)
    yield instance, port, digest.hexdigest()
    with capture(execute=True):
        current = Instance.objects.get(pk=instance.pk)
        if current.state != InstanceState.RELEASED:
            services.release_instance(current, by="test")
