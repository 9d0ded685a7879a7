"""Websocket consumers of the slices app: an instance's live progress, events and logs; live GPU
telemetry."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from django.http import Http404

from console.consumers import (
    CLOSE_BAD_REQUEST,
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_NOT_FOUND,
    MAX_FRAME_CHARS,
    OUTAGE_ERRORS,
    ForwardingJsonConsumer,
    LayerConsumer,
)
from console.tenancy import resolve_scope
from slices.events import instance_group
from slices.models import Cluster
from slices.services import terminal
from slices.services.instances import get_instance_for_operator, get_instance_for_user
from slices.telemetry.groups import cluster_group as telemetry_cluster_group
from slices.telemetry.groups import instance_group as telemetry_instance_group
from slices.telemetry.metrics import websocket_client_changed

logger = logging.getLogger(__name__)


@database_sync_to_async
def _may_see_instance(scope: Any, public_id: str) -> bool:
    """A member sees the team's instance (in the team the session acts in); operators see the
    fleet; anyone else gets "not found"."""
    user = scope.get("user")
    try:
        if user.is_staff:
            get_instance_for_operator(public_id)
        else:
            who = resolve_scope(scope)
            if who is None:
                return False
            get_instance_for_user(who, public_id, operate=False)
    except Http404:
        return False
    return True


@database_sync_to_async
def _scope_acting(scope: Any) -> Any:
    return resolve_scope(scope)


class InstanceConsumer(LayerConsumer):
    """Joins ``instance.<uuid>`` after checking the user may see it; then only forwards. A Redis
    outage closes it with 1013 (``LayerConsumer``); the page polls meanwhile and reconnects."""

    async def connect(self) -> None:
        user = await self.signed_in_user()
        if user is None:
            return
        public_id = self.scope["url_route"]["kwargs"]["public_id"]
        if not await _may_see_instance(self.scope, public_id):
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await self.join(instance_group(public_id))
        await self.accept()
        await self.send_json({"kind": "hello", "payload": {}})

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Browsers only listen here; anything they send is ignored."""

    async def instance_message(self, event: dict[str, Any]) -> None:
        await self.send_json({"kind": event["kind"], "payload": event["payload"]})


# Samples a telemetry client may hold unacknowledged (one being drawn, one on the way).
TELEMETRY_WINDOW = 2


class TelemetryConsumer(ForwardingJsonConsumer):
    """Live GPU samples of one instance (``telemetry.instance.<uuid>``) or, for operators, of one
    cluster (``telemetry.cluster.<code>``). Permission is checked before joining, on every
    connect (so also on every reconnect); then it only forwards.

    Back-pressure: samples are not queued per client. The newest waits in one slot; a writer task
    sends it once the client has acknowledged (``{"kind": "ack"}`` after drawing each sample) all
    but ``TELEMETRY_WINDOW - 1`` of the samples it was sent. A slow browser therefore gets the
    latest sample (with ``skipped``: how many were replaced meanwhile), never a backlog, not even
    one hidden in the kernel's socket buffers, and memory stays flat whatever the client's speed.

    The writer is a ``background`` task: cancelled and awaited however the connection ends (a
    Redis outage closes it with 1013; the charts reconnect and fetch the gap).
    """

    counted = False  # this connection is in the open-websockets gauge

    # A sample and a client's frame (its acks) never touch the database: they skip the hop to a
    # thread that Channels makes before every message to close stale connections (two messages
    # a second per socket; with a hundred sockets, most of what telemetry cost the web process).
    WITHOUT_DATABASE = frozenset({"telemetry.sample", "websocket.receive"})

    async def dispatch(self, message: dict[str, Any]) -> None:
        if message.get("type") in self.WITHOUT_DATABASE:
            await getattr(self, get_handler_name(message))(message)
            return
        await super().dispatch(message)

    async def connect(self) -> None:
        user = await self.signed_in_user()
        if user is None:
            return
        kwargs = self.scope["url_route"]["kwargs"]
        if "code" in kwargs:
            if not (user.is_staff and await self._cluster_exists(kwargs["code"])):
                await self.close(code=CLOSE_NOT_FOUND)
                return
            group = telemetry_cluster_group(kwargs["code"])
            self.stream = "cluster"
        else:
            if not await _may_see_instance(self.scope, kwargs["public_id"]):
                await self.close(code=CLOSE_NOT_FOUND)
                return
            group = telemetry_instance_group(kwargs["public_id"])
            self.stream = "instance"
        self._latest: str | None = None  # the newest sample, JSON
        self._skipped = 0
        self._ready = asyncio.Event()
        self._unacked = 0
        self._credit = asyncio.Event()
        await self.join(group)
        await self.accept()
        await database_sync_to_async(websocket_client_changed)(self.stream, 1)
        self.counted = True
        await self.send_json({"kind": "hello", "payload": {}})
        self.background(self._write())

    @database_sync_to_async
    def _cluster_exists(self, code: str) -> bool:
        return Cluster.objects.filter(code=code).exists()

    async def disconnect(self, code: int) -> None:
        await super().disconnect(code)  # the writer first: it is awaited, then the groups
        if self.counted:
            self.counted = False
            try:
                await database_sync_to_async(websocket_client_changed)(self.stream, -1)
            except OUTAGE_ERRORS as exc:  # the gauge lives in Redis: gone with it
                logger.debug("telemetry client gauge not decremented: %r", exc)

    async def telemetry_sample(self, event: dict[str, Any]) -> None:
        """``text``: the payload as the relay encoded it once for every watcher (``payload``: a
        dict, encoded here)."""
        if self._latest is not None:
            self._skipped += 1  # the client has not taken the previous one yet: replace it
        text = event.get("text")
        self._latest = text if isinstance(text, str) else json.dumps(event["payload"])
        self._ready.set()

    async def receive_message(self, message: dict[str, Any]) -> None:
        if message.get("kind") == "ack":
            self._unacked = max(0, self._unacked - 1)
            self._credit.set()

    async def _write(self) -> None:
        while True:
            await self._ready.wait()
            while self._unacked >= TELEMETRY_WINDOW:  # the client has not drawn what it has
                self._credit.clear()
                await self._credit.wait()
            self._ready.clear()
            payload, skipped = self._latest, self._skipped
            self._latest, self._skipped = None, 0
            if payload is None:
                continue
            if self.closing:
                return  # nothing may follow the close frame
            self._unacked += 1
            await self.send(
                text_data=f'{{"kind":"sample","skipped":{skipped},"payload":{payload}}}'
            )


# The web terminal's close codes besides the project's (console.consumers), mirroring HTTP too.
CLOSE_NORMAL = 1000  # the shell exited
CLOSE_TERMINAL_IDLE = 4408  # no input for SLICES_TERMINAL_IDLE_SECONDS
CLOSE_TERMINAL_NOT_RUNNING = 4409  # the instance is not (or no longer) running
CLOSE_TERMINAL_TOO_MANY = 4429  # SLICES_TERMINAL_MAX_PER_USER reached
CLOSE_TERMINAL_UNAVAILABLE = 4503  # the node could not be reached
TERMINAL_CLOSE_CODES = {
    "not_running": CLOSE_TERMINAL_NOT_RUNNING,
    "stopped": CLOSE_TERMINAL_NOT_RUNNING,
    "too_many": CLOSE_TERMINAL_TOO_MANY,
    "unavailable": CLOSE_TERMINAL_UNAVAILABLE,
    "idle": CLOSE_TERMINAL_IDLE,
    "exited": CLOSE_NORMAL,
}
# How often an open terminal checks that its instance still runs.
TERMINAL_STATE_CHECK_SECONDS = 10.0
# While its input is full, how often a terminal looks whether it was closed meanwhile.
ROOM_CHECK_SECONDS = 1.0


def _query_int(scope: dict[str, Any], name: str, default: int) -> int | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name)
    if not values:
        return default
    text = values[0]
    return int(text) if text.isascii() and text.isdigit() and len(text) < 6 else None


class TerminalConsumer(LayerConsumer):
    """A web terminal on node ``?rank=N`` of an instance (``slices.services.terminal``).

    Permission is checked on connect (the owner, or an operator whose session is recorded as
    such); another customer's instance, a released one, an anonymous visitor: refused like every
    socket here (4404, 4401). Then bytes flow both ways: binary frames are the terminal's bytes
    (keystrokes in, output out); text frames are JSON: ``{"type": "data", "data": text}`` and
    ``{"type": "resize", "cols": c, "rows": r}`` from the browser, ``{"type": "ready", ...}`` and,
    before the server closes, ``{"type": "exit", "reason": ...}`` (idle, exited, stopped,
    not_running, too_many, unavailable) so the page can say why. It uses no channel layer: a
    terminal needs neither Redis nor a group.
    """

    channel_layer_alias = "terminal-uses-no-layer"  # no such alias: get_channel_layer is None

    grant: terminal.TerminalGrant | None = None
    session: terminal.TerminalSession | None = None
    reason = "closed"

    async def connect(self) -> None:
        user = await self.signed_in_user()
        if user is None:
            return
        rank = _query_int(self.scope, "rank", 0)
        if rank is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        public_id = self.scope["url_route"]["kwargs"]["public_id"]
        try:
            who = None if user.is_staff else await _scope_acting(self.scope)
            self.grant = await database_sync_to_async(terminal.authorize)(
                user, public_id, rank, who
            )
        except terminal.TerminalRefused as exc:
            if exc.code == "not_found":
                await self.close(code=CLOSE_NOT_FOUND)
                return
            await self.accept()
            await self._exit(exc.code)
            return
        await self.accept()
        self._outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        cols, rows = _query_int(self.scope, "cols", 80), _query_int(self.scope, "rows", 24)
        try:
            shell = await asyncio.to_thread(terminal.open_shell, self.grant, cols, rows)
        except terminal.TerminalRefused as exc:
            if exc.code == "unavailable":
                await database_sync_to_async(terminal.record_failed)(self.grant, exc.detail)
            await self._exit(exc.code)
            return
        self._room = asyncio.Event()
        self.session = terminal.TerminalSession(
            self.grant, shell, self._from_reader, on_room=self._room_from_writer
        )
        await database_sync_to_async(terminal.record_opened)(self.grant)
        await self.send(
            text_data=json.dumps(
                {
                    "type": "ready",
                    "simulated": self.session.simulated,
                    "rank": self.grant.rank,
                    "node": self.grant.node.hostname,
                    "idle_seconds": terminal.idle_seconds(),
                }
            )
        )
        self.session.start()
        self.background(self._pump())
        self.background(self._watch())

    def _from_reader(self, data: bytes | None) -> None:
        """Called from the session's reader thread."""
        with contextlib.suppress(RuntimeError):  # the loop is closing: the connection is gone
            self._loop.call_soon_threadsafe(self._outbox.put_nowait, data)

    def _room_from_writer(self) -> None:
        """Called from the session's writer thread: refused input may be offered again."""
        with contextlib.suppress(RuntimeError):  # the loop is closing: the connection is gone
            self._loop.call_soon_threadsafe(self._room.set)

    async def _offer(self, put: Callable[[], bool]) -> None:
        """Hand input to the session, waiting while its input is full. Meanwhile no further
        frame is read (the consumer handles one message at a time), so the server stops reading
        the socket and the browser's sends wait: back-pressure instead of an unbounded queue.
        The wait ends when the writer makes room, or when the terminal closes (idle, stopped,
        exited)."""
        while not put():
            self._room.clear()
            if put():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), ROOM_CHECK_SECONDS)
            if self.closing or self.session is None:
                return

    async def _pump(self) -> None:
        """The terminal's output to the browser, what is queued sent as one frame."""
        session = self.session
        assert session is not None
        while True:
            chunks = [await self._outbox.get()]
            while not self._outbox.empty() and chunks[-1] is not None:
                chunks.append(self._outbox.get_nowait())
            ended = chunks[-1] is None
            data = b"".join(c for c in chunks if c)
            if data and not self.closing:
                await self.send(bytes_data=data)
                session.delivered(len(data))
            if ended:
                await self._exit("exited")
                return

    async def _watch(self) -> None:
        """Close an idle terminal, and one whose instance no longer runs."""
        session, grant = self.session, self.grant
        assert session is not None and grant is not None
        idle = terminal.idle_seconds()
        next_check = TERMINAL_STATE_CHECK_SECONDS
        while True:
            left = idle - session.idle_for()
            if left <= 0:
                await self._exit("idle")
                return
            await asyncio.sleep(min(left, next_check))
            next_check -= min(left, next_check)
            if next_check <= 0:
                next_check = TERMINAL_STATE_CHECK_SECONDS
                if not await database_sync_to_async(terminal.still_running)(grant):
                    await self._exit("stopped")
                    return

    async def _exit(self, reason: str) -> None:
        """Tell the browser why, then close with the reason's code."""
        if self.closing:
            return
        self.reason = reason
        payload: dict[str, Any] = {"type": "exit", "reason": reason}
        if reason == "idle":
            payload["idle_seconds"] = terminal.idle_seconds()
        await self.send(text_data=json.dumps(payload))
        await self.close(code=TERMINAL_CLOSE_CODES.get(reason, CLOSE_NORMAL))

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        session = self.session
        if self.closing or session is None:
            return  # before "ready" or after the close: dropped
        if bytes_data is not None:
            if len(bytes_data) > MAX_FRAME_CHARS:
                await self.close(code=CLOSE_MESSAGE_TOO_BIG)
                return
            await self._offer(lambda: session.input(bytes_data))
            return
        if text_data is None:
            return
        if len(text_data) > MAX_FRAME_CHARS:
            await self.close(code=CLOSE_MESSAGE_TOO_BIG)
            return
        try:
            message = json.loads(text_data)
        except (ValueError, RecursionError):
            message = None
        if not isinstance(message, dict):
            await self.close(code=CLOSE_BAD_REQUEST)
            return
        kind = message.get("type")
        if kind == "data" and isinstance(message.get("data"), str):
            data = message["data"].encode("utf-8", "replace")
            await self._offer(lambda: session.input(data))
        elif kind == "resize":
            cols, rows = message.get("cols"), message.get("rows")
            await self._offer(lambda: session.resize(cols, rows))

    async def disconnect(self, code: int) -> None:
        await super().disconnect(code)  # the pump and the watchdog first
        session, self.session = self.session, None
        if session is None or self.grant is None:
            return
        seconds = await asyncio.to_thread(session.stop)
        try:
            await database_sync_to_async(terminal.record_closed)(self.grant, self.reason, seconds)
        except OUTAGE_ERRORS as exc:  # the database is gone: the session still ended
            logger.warning("terminal session not recorded: %r", exc)
