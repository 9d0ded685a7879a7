"""The web terminal's websocket (``/ws/instances/<id>/terminal/``) on the simulated fleet: who may
open it, the simulated shell's answers, the idle timeout, and the events that record a session.

In-process through the real router, as in tests/slices/test_telemetry_consumer.py. The terminal on
a real PTY over SSH is tests/slices/test_terminal_ssh.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from django.contrib.auth.models import AnonymousUser

from billing.models import PriceBook
from billing.seed import seed_default_prices
from console.consumers import CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED
from console.models import User
from console.routing import websocket_router
from slices.choices import InstanceState
from slices.consumers import (
    CLOSE_NORMAL,
    CLOSE_TERMINAL_IDLE,
    CLOSE_TERMINAL_NOT_RUNNING,
    CLOSE_TERMINAL_TOO_MANY,
    CLOSE_TERMINAL_UNAVAILABLE,
)
from slices.drivers.sim_shell import SimShell
from slices.models import Instance, InstanceEvent
from slices.services import terminal
from tests.slices.factories import run_order
from tests.support.servers import run_async
from tests.support.websocket import open_websocket, websocket_scope

pytestmark = pytest.mark.django_db(transaction=True)

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def running(sim_fleet, funded, django_capture_on_commit_callbacks) -> Instance:
    if not PriceBook.objects.exists():  # a transactional test flushed the migration's seed
        seed_default_prices()
    instance = run_order(funded, django_capture_on_commit_callbacks, name="训练机")
    assert instance.state == InstanceState.RUNNING
    return instance


def _path(instance: Instance) -> str:
    return f"/ws/instances/{instance.public_id}/terminal/"


async def _open(
    instance: Instance, user: Any, query: str = "rank=0&cols=120&rows=40"
) -> tuple[ApplicationCommunicator, dict[str, Any]]:
    scope = websocket_scope(_path(instance), user=user, query_string=query.encode())
    return await open_websocket(websocket_router(), scope)


class Terminal:
    """The browser's side of one open terminal."""

    def __init__(self, communicator: ApplicationCommunicator) -> None:
        self.c = communicator
        self.output = b""
        self.texts: list[dict[str, Any]] = []
        self.closed: int | None = None

    async def ready(self) -> dict[str, Any]:
        message = await self.c.receive_output(timeout=10)
        assert message["type"] == "websocket.send" and message.get("text"), message
        ready = json.loads(message["text"])
        assert ready["type"] == "ready", ready
        return ready

    async def type(self, text: str) -> None:
        await self.c.send_input({"type": "websocket.receive", "bytes": text.encode()})

    async def resize(self, cols: int, rows: int) -> None:
        text = json.dumps({"type": "resize", "cols": cols, "rows": rows})
        await self.c.send_input({"type": "websocket.receive", "text": text})

    async def until(self, needle: bytes, timeout: float = 15) -> bytes:
        """Read output until ``needle`` appears (ANSI colours removed); everything so far."""
        while needle not in ANSI.sub(b"", self.output):
            message = await self.c.receive_output(timeout=timeout)
            if message["type"] == "websocket.close":
                self.closed = message.get("code")
                raise AssertionError(f"closed ({self.closed}) before {needle!r}: {self.output!r}")
            if message.get("bytes"):
                self.output += message["bytes"]
            elif message.get("text"):
                self.texts.append(json.loads(message["text"]))
        return ANSI.sub(b"", self.output)

    async def until_closed(self, timeout: float = 15) -> int:
        while True:
            message = await self.c.receive_output(timeout=timeout)
            if message["type"] == "websocket.close":
                self.closed = message.get("code")
                return int(self.closed or 0)
            if message.get("bytes"):
                self.output += message["bytes"]
            elif message.get("text"):
                self.texts.append(json.loads(message["text"]))

    async def leave(self) -> None:
        await self.c.send_input({"type": "websocket.disconnect", "code": 1000})
        await self.c.wait(timeout=10)


async def _refused(instance: Instance, user: Any, query: str = "rank=0") -> int:
    communicator, first = await _open(instance, user, query)
    assert first["type"] == "websocket.close", first  # refused before accepting
    await communicator.send_input({"type": "websocket.disconnect", "code": first["code"]})
    await communicator.wait(timeout=5)
    return int(first["code"])


def _terminal_events(instance: Instance) -> list[InstanceEvent]:
    return list(
        InstanceEvent.objects.filter(instance=instance, code__startswith="terminal_").order_by("pk")
    )


def test_the_simulated_shell_answers_nvidia_smi_for_the_instance(running: Instance, alice) -> None:
    async def scenario() -> tuple[dict[str, Any], bytes]:
        communicator, first = await _open(running, alice)
        assert first["type"] == "websocket.accept", first
        term = Terminal(communicator)
        ready = await term.ready()
        await term.until(b"# ")  # the banner and the prompt
        await term.type("nvidia-smi\r")
        out = await term.until(b"Processes:")
        await term.until(b"+\r\n")
        await term.type("echo 你好\r")
        out = await term.until("你好\r\n".encode())
        await term.leave()
        return ready, out

    ready, out = run_async(scenario())
    assert ready["simulated"] is True and ready["rank"] == 0
    assert ready["idle_seconds"] == 900
    text = out.decode()
    assert "[simulated]" in text and "[模拟]" in text  # labelled in the banner
    # The table: one row per GPU of the instance (8 × RTX 4090), numbered as the container sees.
    rows = re.findall(r"^\|\s+(\d+)\s+NVIDIA GeForce RTX 4090\s+On\s+\|", text, re.MULTILINE)
    assert rows == [str(i) for i in range(8)]
    assert "24564MiB" in text  # the model's memory
    assert "NVIDIA-SMI" in text and "CUDA Version" in text


def test_line_editing_ctrl_c_and_unknown_commands_in_the_simulated_shell(settings) -> None:
    from slices.drivers.base import InstanceSpec, NodeTarget

    node = NodeTarget("gpu-sim-1", "10.0.0.1", 22, "SHA256:x", 0, (0, 1), node_gpus=8)
    spec = InstanceSpec("i-1", "gpc-1", "box", "o", "img", "", {}, (), "", (node,), 2)
    shell = SimShell(spec, node, gpu_model="A800", time_scale=1.0)

    def run(keys: str, until: bytes) -> str:
        shell.send(keys.encode())
        out = b""
        while until not in ANSI.sub(b"", out):
            chunk = shell.recv(5)
            assert chunk is not None, out
            out += chunk
        return ANSI.sub(b"", out).decode()

    run("", b"# ")
    # Backspace over a wide character erases two columns, and the command runs without it.
    out = run("echo ab你\x7f\x7fc\r", b"ac\r\n")
    assert "\b\b  \b\b" in out
    out = run("frobnicate\r", b"# ")
    assert "frobnicate: command not found" in out
    # A real-time training run is interrupted by Ctrl-C and the prompt comes back.
    out = run("python train.py\r", b"step    1/20")
    out = run("\x03", b"KeyboardInterrupt")
    assert "step   20/20" not in out
    out = run("stty size\r", b"24 80")
    shell.resize(132, 50)
    out = run("stty size\r", b"50 132")
    out = run("ls /pfs\r", b"checkpoints")
    out = run("df -h\r", b"/pfs")
    assert "Filesystem" in out
    shell.send(b"exit\r")
    drained = b""
    while (chunk := shell.recv(1)) is not None:
        drained += chunk
    assert b"logout" in drained
    assert shell.recv(0.1) is None  # ended


def test_an_anonymous_visitor_another_customer_and_a_released_instance_are_refused(
    running: Instance, alice, bob
) -> None:
    assert run_async(_refused(running, AnonymousUser())) == CLOSE_UNAUTHENTICATED
    assert run_async(_refused(running, bob)) == CLOSE_NOT_FOUND
    assert run_async(_refused(running, alice, "rank=7")) == CLOSE_NOT_FOUND  # no such node
    assert run_async(_refused(running, alice, "rank=x")) == CLOSE_NOT_FOUND
    Instance.objects.filter(pk=running.pk).update(state=InstanceState.RELEASED)
    assert run_async(_refused(running, alice)) == CLOSE_NOT_FOUND
    assert _terminal_events(running) == []  # nothing was opened


def test_a_stopped_instance_has_no_terminal_and_the_page_is_told_why(
    running: Instance, alice
) -> None:
    Instance.objects.filter(pk=running.pk).update(state=InstanceState.STOPPED)

    async def scenario() -> Terminal:
        communicator, first = await _open(running, alice)
        assert first["type"] == "websocket.accept"
        term = Terminal(communicator)
        await term.until_closed()
        await term.leave()
        return term

    term = run_async(scenario())
    assert term.closed == CLOSE_TERMINAL_NOT_RUNNING
    assert term.texts == [{"type": "exit", "reason": "not_running"}]


def test_an_idle_terminal_closes_and_says_why_and_the_session_is_recorded(
    running: Instance, alice, settings
) -> None:
    settings.SLICES_TERMINAL_IDLE_SECONDS = 1
    secret = "s3cr3t-typed-text-4711"

    async def scenario() -> Terminal:
        communicator, _first = await _open(running, alice)
        term = Terminal(communicator)
        await term.ready()
        await term.type(f"echo {secret}\r")
        await term.until(f"{secret}\r\n".encode())
        assert await term.until_closed() == CLOSE_TERMINAL_IDLE
        await term.leave()
        return term

    term = run_async(scenario())
    assert term.texts[-1] == {"type": "exit", "reason": "idle", "idle_seconds": 1}
    opened, closed = _terminal_events(running)
    assert opened.code == "terminal_opened"
    assert opened.params == {"user": alice.get_username(), "rank": 0, "operator": False}
    assert opened.node == running.nodes.get(rank=0).hostname
    assert closed.code == "terminal_idle"
    assert closed.params["seconds"] >= 1 and closed.params["idle"] == 1
    assert closed.at >= opened.at
    # Never the keystrokes nor the output, anywhere in the instance's events or logs.
    for event in InstanceEvent.objects.filter(instance=running):
        assert secret not in event.text and secret not in json.dumps(event.params)


def test_exit_ends_the_session_and_records_its_length(running: Instance, alice) -> None:
    async def scenario() -> Terminal:
        communicator, _first = await _open(running, alice)
        term = Terminal(communicator)
        await term.ready()
        await term.type("exit\r")
        assert await term.until_closed() == CLOSE_NORMAL
        await term.leave()
        return term

    term = run_async(scenario())
    assert term.texts[-1] == {"type": "exit", "reason": "exited"}
    assert [e.code for e in _terminal_events(running)] == ["terminal_opened", "terminal_exited"]
    assert terminal.open_count(running.created_by_id) == 0  # the slot is free again


def test_a_user_may_hold_only_so_many_terminals(running: Instance, alice, settings) -> None:
    settings.SLICES_TERMINAL_MAX_PER_USER = 1

    async def scenario() -> tuple[int, list[dict[str, Any]]]:
        c1, _ = await _open(running, alice)
        first = Terminal(c1)
        await first.ready()
        c2, accepted = await _open(running, alice)
        assert accepted["type"] == "websocket.accept"
        second = Terminal(c2)
        code = await second.until_closed()
        await second.leave()
        await first.leave()
        return code, second.texts

    code, texts = run_async(scenario())
    assert code == CLOSE_TERMINAL_TOO_MANY
    assert texts == [{"type": "exit", "reason": "too_many"}]
    assert terminal.open_count(running.created_by_id) == 0


def test_an_operator_may_open_a_customers_terminal_and_it_is_recorded(
    running: Instance, alice
) -> None:
    operator = User.objects.create_user("ops@example.com", password="x", is_staff=True)

    async def scenario() -> None:
        communicator, first = await _open(running, operator)
        assert first["type"] == "websocket.accept"
        term = Terminal(communicator)
        await term.ready()
        await term.leave()

    run_async(scenario())
    opened, closed = _terminal_events(running)
    assert opened.code == "terminal_operator_opened" and opened.level == "warning"
    assert opened.params["user"] == "ops@example.com" and opened.params["operator"] is True
    assert closed.code == "terminal_closed"


def test_a_page_on_another_origin_cannot_open_a_terminal(running: Instance, alice_client) -> None:
    """The production stack's origin check covers this route: the customer's own cookies sent
    from another site's page (cross-site websocket hijacking) open nothing."""
    from channels.auth import AuthMiddlewareStack

    from console.routing import OriginValidator

    app = OriginValidator(AuthMiddlewareStack(websocket_router()))
    cookie = f"sessionid={alice_client.cookies['sessionid'].value}".encode()

    async def attempt(origin: bytes) -> str:
        headers = [(b"origin", origin), (b"host", b"testserver"), (b"cookie", cookie)]
        scope = websocket_scope(
            _path(running),
            headers=headers,
            client=("127.0.0.1", 50000),
            server=("testserver", 80),
            query_string=b"rank=0",
        )
        communicator, first = await open_websocket(app, scope)
        await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
        await communicator.wait(timeout=10)
        return first["type"]

    assert run_async(attempt(b"http://localhost:9999")) == "websocket.close"
    assert run_async(attempt(b"https://evil.example")) == "websocket.close"
    assert run_async(attempt(b"http://testserver")) == "websocket.accept"


def test_a_node_that_cannot_be_reached_is_told_and_recorded(running: Instance, alice) -> None:
    Instance.objects.filter(pk=running.pk).update(env={**running.env, "SIM_FAIL": "shell"})

    async def scenario() -> Terminal:
        communicator, first = await _open(running, alice)
        assert first["type"] == "websocket.accept"
        term = Terminal(communicator)
        await term.until_closed()
        await term.leave()
        return term

    term = run_async(scenario())
    assert term.closed == CLOSE_TERMINAL_UNAVAILABLE
    assert term.texts == [{"type": "exit", "reason": "unavailable"}]
    (failed,) = _terminal_events(running)
    assert failed.code == "terminal_failed" and failed.params["error"] == "sim_failure"
    assert terminal.open_count(running.created_by_id) == 0


def test_a_terminal_closes_when_its_instance_stops_running(
    running: Instance, alice, monkeypatch
) -> None:
    from asgiref.sync import sync_to_async

    from slices import consumers

    monkeypatch.setattr(consumers, "TERMINAL_STATE_CHECK_SECONDS", 0.2)

    async def scenario() -> Terminal:
        communicator, _first = await _open(running, alice)
        term = Terminal(communicator)
        await term.ready()
        await sync_to_async(Instance.objects.filter(pk=running.pk).update, thread_sensitive=True)(
            state=InstanceState.STOPPED
        )
        await term.until_closed()
        await term.leave()
        return term

    term = run_async(scenario())
    assert term.closed == CLOSE_TERMINAL_NOT_RUNNING
    assert term.texts[-1] == {"type": "exit", "reason": "stopped"}
    assert [e.code for e in _terminal_events(running)] == ["terminal_opened", "terminal_stopped"]
