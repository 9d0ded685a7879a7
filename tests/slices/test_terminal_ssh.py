"""The web terminal on a real sshd test host (runtime=process): a real PTY over the console's
pinned connection, through the websocket, and the shell's environment reaching it as data.

An RTX 4090 box is ordered onto one test host with the ssh driver (as in
tests/slices/test_stop_start_ssh.py); the terminal opens a login shell in the instance's
directory with the instance's environment.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from billing.models import PriceBook
from billing.seed import seed_default_prices
from console.consumers import CLOSE_NOT_FOUND
from console.routing import websocket_router
from slices import services
from slices.choices import InstanceState
from slices.drivers.base import DriverError
from slices.drivers.ssh.shell import SHARED
from slices.models import Instance, InstanceEvent, Node
from slices.services import terminal
from tests.slices.factories import load_small_fleet, run_order
from tests.slices.test_ssh_driver import make_driver, make_node, make_spec
from tests.slices.test_terminal import Terminal
from tests.support.servers import run_async
from tests.support.sshd import (  # noqa: F401
    SshFleet,
    SshHostPool,
    configure_ssh_fleet,
    host_pid,
    instance_namespace,
    ssh_hosts,
)
from tests.support.websocket import open_websocket, websocket_scope

pytestmark = pytest.mark.django_db(transaction=True)

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


@pytest.fixture
def box(
    settings,
    ssh_hosts: SshHostPool,  # noqa: F811
    funded,
    tmp_path: Path,
    django_capture_on_commit_callbacks,
) -> tuple[Instance, SshFleet]:
    """A running 4-card RTX 4090 box on one sshd test host (bare process runtime)."""
    if not PriceBook.objects.exists():  # a transactional test flushed the migration's seed
        seed_default_prices()
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SSH_CONNECT_TIMEOUT = 5.0
    settings.SLICES_SSH_COMMAND_TIMEOUT = 30.0
    load_small_fleet()
    node = Node.objects.get(hostname="xm-4090-r01-n01")
    for other in Node.objects.filter(cluster__code="xm-4090").exclude(pk=node.pk):
        services.change_node_state(other, "maintenance", "not a test host")
    fleet = configure_ssh_fleet(
        settings, ssh_hosts.get(1), [node], tmp_path, client_key=ssh_hosts.client_key
    )
    instance = run_order(
        funded,
        django_capture_on_commit_callbacks,
        cards=4,
        name="box",
        env={"GREETING": "你好 $(touch /tmp/gpc-terminal-never-evaluated) `id`"},
    )
    assert instance.state == InstanceState.RUNNING, list(
        instance.events.values_list("code", "text")
    )
    return instance, fleet


async def _open(instance: Instance, user: Any, query: str) -> Terminal:
    path = f"/ws/instances/{instance.public_id}/terminal/"
    scope = websocket_scope(path, user=user, query_string=query.encode())
    communicator, first = await open_websocket(websocket_router(), scope)
    assert first["type"] == "websocket.accept", first
    return Terminal(communicator)


def test_a_real_pty_speaks_utf8_and_follows_resizes(box, alice, bob) -> None:
    instance, fleet = box
    root = fleet.workdirs["xm-4090-r01-n01"] / "instances" / instance.slug

    async def scenario() -> tuple[dict[str, Any], bytes, bytes, bytes, bytes]:
        term = await _open(instance, alice, "rank=0&cols=100&rows=30")
        ready = await term.ready()
        await term.type("echo 你好; tty; pwd\r")
        hello = await term.until(b"/dev/pts/")
        hello = await term.until(str(root).encode() + b"\r\n")
        await term.type("stty size\r")
        first = await term.until(b"30 100\r\n")
        await term.resize(132, 43)
        await term.type("stty size\r")
        resized = await term.until(b"43 132\r\n")
        # The instance's environment, exactly as the customer wrote it (nothing evaluated it).
        await term.type('printf \'<%s>\\n\' "$GREETING" "$NODE_RANK"\r')
        env = await term.until(b"<0>")
        await term.type("exit\r")
        await term.until_closed()
        await term.leave()
        return ready, hello, first, resized, env

    ready, hello, first, resized, env = run_async(scenario())
    assert ready["simulated"] is False and ready["node"] == "xm-4090-r01-n01"
    text = hello.decode("utf-8")  # valid UTF-8 end to end
    assert re.search(r"^\r?你好\r$", text, re.MULTILINE)  # readline may start with \r
    assert re.search(r"^/dev/pts/\d+\r$", text, re.MULTILINE)  # a real terminal
    assert "<你好 $(touch /tmp/gpc-terminal-never-evaluated) `id`>" in env.decode()
    assert not Path("/tmp/gpc-terminal-never-evaluated").exists()
    assert not list(root.glob("shell-*.args"))  # the argument file is gone once the shell runs
    codes = list(
        InstanceEvent.objects.filter(instance=instance, code__startswith="terminal_")
        .order_by("pk")
        .values_list("code", flat=True)
    )
    assert codes == ["terminal_opened", "terminal_exited"]
    assert not SHARED.by_node or not any(SHARED.by_node.values())  # connection closed with it

    # Another customer cannot open it; nor anyone once it is released.
    async def refused(user: Any) -> int:
        path = f"/ws/instances/{instance.public_id}/terminal/"
        communicator, first = await open_websocket(
            websocket_router(), websocket_scope(path, user=user, query_string=b"rank=0")
        )
        assert first["type"] == "websocket.close"
        await communicator.send_input({"type": "websocket.disconnect", "code": first["code"]})
        await communicator.wait(timeout=5)
        return int(first["code"])

    assert run_async(refused(bob)) == CLOSE_NOT_FOUND
    Instance.objects.filter(pk=instance.pk).update(state=InstanceState.RELEASED)
    assert run_async(refused(alice)) == CLOSE_NOT_FOUND


def test_closing_the_terminal_hangs_up_its_shell(ssh_hosts: SshHostPool, tmp_path: Path) -> None:  # noqa: F811
    """Driver level: the shell's processes end with the channel (a hangup), and a node whose
    host key is not the pinned one is refused before any shell runs. A terminal joins a running
    instance only (its PID namespace: the process rule)."""
    host = ssh_hosts.get(1)[0]
    driver = make_driver(ssh_hosts, {"pfs": tmp_path, "assets": tmp_path})
    node = make_node(host, tmp_path / "node")
    (tmp_path / "node").mkdir()
    spec = make_spec((node,))
    early, said = driver.open_shell(spec, node, 80, 24), b""
    deadline = time.monotonic() + 20
    while (chunk := early.recv(1.0)) is not None and time.monotonic() < deadline:
        said += chunk
    early.close()
    assert b"the instance is not running" in said, said
    driver.prepare(spec, node, lambda _line: None)
    driver.start(spec, node, lambda _line: None)
    shell = driver.open_shell(spec, node, 80, 24)
    marker = tmp_path / "shell.pid"
    shell.send(f"echo $$ > {marker}; echo ready-$((6*7))\r".encode())
    out = b""
    deadline = time.monotonic() + 20
    while b"ready-42" not in out:
        assert time.monotonic() < deadline, out
        chunk = shell.recv(1.0)
        assert chunk is not None, out
        out += chunk
    # ``$$`` as the instance's PID namespace numbers it; the shell is in that namespace.
    launcher = int((tmp_path / "node" / "instances" / spec.slug / "pid").read_text())
    pid = host_pid(instance_namespace(launcher), int(marker.read_text()))
    shell.close()
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, "the shell outlived its terminal"
        time.sleep(0.1)
    assert shell.recv(0.1) is None
    with pytest.raises(DriverError):
        shell.send(b"echo again\r")

    wrong = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x"
    bad = make_node(host, tmp_path / "node", host_key=wrong)
    with pytest.raises(DriverError) as refused:
        driver.open_shell(make_spec((bad,)), bad, 80, 24)
    assert refused.value.code == "host_key_mismatch"
    driver.teardown(spec, node, lambda _line: None)


def test_the_ready_message_and_output_are_json_and_bytes(box, alice) -> None:
    """Keystrokes may also come as JSON text frames ({"type": "data"})."""
    instance, _fleet = box

    async def scenario() -> bytes:
        term = await _open(instance, alice, "rank=0")
        await term.ready()
        await term.c.send_input(
            {
                "type": "websocket.receive",
                "text": json.dumps({"type": "data", "data": "echo 中文-$((1+1))\r"}),
            }
        )
        out = await term.until("中文-2\r\n".encode())
        await term.leave()
        return out

    assert "中文-2" in run_async(scenario()).decode()


def test_input_to_a_shell_that_does_not_read_is_bounded_by_back_pressure(
    box, alice, tmp_path: Path
) -> None:
    """Issue 29: keystrokes were queued without bound (790 MB in 25 s took the console from 173
    to 897 MB). A real PTY whose program does not read: once the session's input is full the
    consumer stops taking the browser's frames (they wait on the client's side, here the test's
    queue), and when the program reads again every byte arrives, none dropped."""
    instance, _fleet = box
    gate = tmp_path / "gate"
    frame = b"x" * 65536
    frames = 512  # 32 MiB
    total = len(frame) * frames

    async def scenario() -> tuple[int, int]:
        term = await _open(instance, alice, "rank=0")
        await term.ready()
        await term.type(
            f"stty raw -echo; while [ ! -e {gate} ]; do sleep 0.1; done; "
            f"head -c {total} >/dev/null; stty sane; echo ALL-$((6*7))-READ\r"
        )
        await term.until(b"sleep 0.1")  # the line was echoed before -echo: it runs
        for _ in range(frames):
            await term.c.send_input({"type": "websocket.receive", "bytes": frame})
        # Wait until the consumer stops taking frames (the queue's length holds still).
        queue = term.c.input_queue
        last, still = -1, 0
        while still < 20:
            await asyncio.sleep(0.1)
            still = still + 1 if queue.qsize() == last else 0
            last = queue.qsize()
        taken = (frames - queue.qsize()) * len(frame)
        waiting = queue.qsize()
        gate.touch()
        await term.until(b"ALL-42-READ", timeout=120)  # every byte reached the program
        await term.leave()
        return taken, waiting

    taken, waiting = run_async(scenario())
    # What the console took: its own bound, the SSH channel's window and the PTY's buffer.
    assert terminal.MAX_PENDING_INPUT_BYTES == 256 * 1024
    assert taken < 8 * 1024 * 1024, taken
    assert waiting > frames // 2, waiting  # the rest waited on the sender's side
