"""The production edge as the benchmarks run it: nginx rendered by ``console.edge`` (what the
Procfile's ``manage.py edge`` runs) in front of a console the bench started, and its stop."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.servers import free_port


def start_edge(
    edge_dir: Path, work: Path, web_port: int, timeout: float = 30.0
) -> tuple[int, subprocess.Popen[bytes]]:
    """nginx on a free loopback port in front of the console on ``web_port``; its port and
    process. RuntimeError, with nginx's own words, when it does not listen within ``timeout``."""
    from console import edge

    port = free_port()
    static = work / "static"
    static.mkdir(exist_ok=True)
    opts = dataclasses.replace(
        edge.options(f"127.0.0.1:{port}", (f"127.0.0.1:{web_port}",), workers="2"),
        static_root=static,
    )
    conf = edge.write(opts)
    out = edge_dir / "logs" / "nginx.out"
    proc = subprocess.Popen(
        edge.command(conf, edge_dir),
        stdout=subprocess.DEVNULL,
        stderr=out.open("wb"),
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return port, proc
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log = out.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"nginx did not start on {port}: {log}")
        time.sleep(0.05)


def stop_edge(proc: subprocess.Popen[bytes], edge_dir: Path) -> None:
    """nginx stopped (killed if it lingers), the edge's OpenSSH masters closed, its folder gone."""
    from slices.drivers.ssh import edge as ssh_edge

    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    ssh_edge.close_all(edge_dir / "tunnels")
    shutil.rmtree(edge_dir, ignore_errors=True)
