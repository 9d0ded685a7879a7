"""The web terminal (issue 19): who may open one, the relay between a driver's ``Shell`` and a
browser, and the events that record each session.

- ``authorize`` decides on connect: the owner of a running instance, or an operator (staff) whose
  session is recorded as an operator's (a warning event naming them). Another customer's
  instance, a released or failed one, or a rank the instance does not have are "not found".
- ``open_shell`` opens the driver's shell (blocking: the SSH connection, no database), and
  ``TerminalSession`` relays it; ``record_opened`` and ``record_closed`` write the events: who,
  which node, how it ended and how long it lasted (``terminal_closed``, ``terminal_idle``,
  ``terminal_exited``, ``terminal_stopped``). What was typed or printed is never stored or
  logged.
- A session runs two threads of its own: a reader that waits in ``Shell.recv`` and hands output
  to the consumer (at most ``MAX_PENDING_BYTES`` not yet sent to the browser: a fast printer
  waits for a slow browser instead of filling memory), and a writer that sends keystrokes and
  resizes in order. The event loop never waits on the node.
- Input is bounded the same way (issue 29: 790 MB typed in 25 s were queued whole): at most
  ``MAX_PENDING_INPUT_BYTES`` wait for the shell. Past that ``input`` takes nothing and says so;
  the consumer then stops reading the browser's frames until the writer has made room
  (``on_room``), so the server stops reading the socket and the sender waits: back-pressure, and
  nothing typed is dropped.
- At most ``SLICES_TERMINAL_MAX_PER_USER`` sessions are open per user in this process.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.utils import timezone

from marketplace import services as marketplace
from slices.choices import EventKind, EventLevel, InstanceState
from slices.drivers import get_driver
from slices.drivers.base import DriverError, InstanceSpec, NodeTarget, Shell
from slices.models import Instance
from slices.services.instances import (
    get_instance_for_operator,
    get_instance_for_user,
    record_event,
)
from slices.services.provisioning import build_spec

logger = logging.getLogger(__name__)

MAX_PENDING_BYTES = 256 * 1024
MAX_PENDING_INPUT_BYTES = 256 * 1024
RESIZE_COST = 64  # what a queued resize counts against the input bound
READ_WAIT_SECONDS = 0.5
MIN_COLS, MAX_COLS = 2, 1000
MIN_ROWS, MAX_ROWS = 1, 500
# Instances whose terminal is "not found": gone for good (nothing left to open a shell in).
GONE_STATES = (InstanceState.RELEASED, InstanceState.FAILED)

# How a session ended -> the event that records it.
CLOSE_EVENTS = {
    "closed": "terminal_closed",  # the browser closed it (or left)
    "idle": "terminal_idle",  # no input for SLICES_TERMINAL_IDLE_SECONDS
    "exited": "terminal_exited",  # the shell ended (exit, Ctrl-D)
    "stopped": "terminal_stopped",  # the instance stopped running
}


class TerminalRefused(Exception):
    """No terminal: ``code`` is not_found, not_running, too_many or unavailable."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class TerminalGrant:
    """What a checked connect may open: one node of one instance, for one user."""

    instance_id: int
    public_id: str
    user_id: int
    user_name: str
    operator: bool  # staff opening another customer's instance
    driver: str
    gpu_model: str
    spec: InstanceSpec
    node: NodeTarget

    @property
    def rank(self) -> int:
        return self.node.rank


def idle_seconds() -> int:
    return int(settings.SLICES_TERMINAL_IDLE_SECONDS)


def clamp_size(cols: Any, rows: Any) -> tuple[int, int]:
    """A terminal size the PTY accepts (defaults 80 × 24 for anything that is not a number)."""
    try:
        c, r = int(cols), int(rows)
    except (TypeError, ValueError):
        return 80, 24
    return max(MIN_COLS, min(MAX_COLS, c)), max(MIN_ROWS, min(MAX_ROWS, r))


def _find(user: Any, public_id: Any, acting: Any = None) -> tuple[Instance, bool]:
    """The instance and whether this is an operator's access (staff, not the owner). A member
    opens a shell on what they may operate (their own; every one for a team admin)."""
    try:
        return get_instance_for_user(acting or user, public_id, operate=True), False
    except (Http404, PermissionDenied):
        if not user.is_staff:
            raise
    return get_instance_for_operator(public_id), True


def authorize(user: Any, public_id: Any, rank: int, acting: Any = None) -> TerminalGrant:
    """Whether ``user`` may open a terminal on node ``rank`` of the instance, checked now."""
    if user is None or not user.is_authenticated:
        raise TerminalRefused("not_found")
    try:
        instance, operator = _find(user, public_id, acting)
    except (Http404, PermissionDenied):
        raise TerminalRefused("not_found") from None
    if instance.state in GONE_STATES:
        raise TerminalRefused("not_found")
    if instance.state != InstanceState.RUNNING:
        raise TerminalRefused("not_running", instance.state)
    spec = build_spec(instance)
    node = next((n for n in spec.nodes if n.rank == rank), None)
    if node is None:
        raise TerminalRefused("not_found", f"no node of rank {rank}")
    # The image's versions, for a shell that answers from the catalogue (the simulated one).
    spec = replace(spec, software=marketplace.image_software(instance.image))
    return TerminalGrant(
        instance_id=instance.pk,
        public_id=str(instance.public_id),
        user_id=user.pk,
        user_name=user.get_username(),
        operator=operator,
        driver=instance.driver or settings.SLICES_DRIVER,
        gpu_model=instance.gpu_model.code,
        spec=spec,
        node=node,
    )


def still_running(grant: TerminalGrant) -> bool:
    state = Instance.objects.filter(pk=grant.instance_id).values_list("state", flat=True).first()
    return state == InstanceState.RUNNING


# -- the per-user cap ---------------------------------------------------------------------------
_open_lock = threading.Lock()
_open_counts: dict[int, int] = {}


def _reserve(user_id: int) -> bool:
    with _open_lock:
        if _open_counts.get(user_id, 0) >= int(settings.SLICES_TERMINAL_MAX_PER_USER):
            return False
        _open_counts[user_id] = _open_counts.get(user_id, 0) + 1
        return True


def _unreserve(user_id: int) -> None:
    with _open_lock:
        left = _open_counts.get(user_id, 0) - 1
        if left > 0:
            _open_counts[user_id] = left
        else:
            _open_counts.pop(user_id, None)


def open_count(user_id: int) -> int:
    with _open_lock:
        return _open_counts.get(user_id, 0)


# -- sessions -----------------------------------------------------------------------------------
OutputFn = Callable[[bytes | None], None]
RoomFn = Callable[[], None]


class TerminalSession:
    """One open terminal: the shell, its reader and writer threads, and when it was last used.

    ``on_output`` is called from the reader thread with each chunk the terminal printed, and
    once with None when the shell ended; the consumer calls ``delivered(n)`` once it has sent
    ``n`` of those bytes to the browser. ``on_room`` is called from the writer thread when input
    refused for want of room (``input`` or ``resize`` returned False) may be offered again."""

    def __init__(
        self,
        grant: TerminalGrant,
        shell: Shell,
        on_output: OutputFn,
        on_room: RoomFn | None = None,
    ) -> None:
        self.grant = grant
        self.shell = shell
        self.simulated = bool(getattr(shell, "simulated", False))
        self.opened_at = timezone.now()
        self._started = time.monotonic()
        self.last_input = self._started
        self._on_output = on_output
        self._on_room = on_room
        self._pending = 0
        self._input_pending = 0  # bytes given to ``input`` not yet sent to the shell
        self._input_full = False  # ``input`` refused something since room was last made
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._inbox: queue.SimpleQueue[bytes | tuple[int, int] | None] = queue.SimpleQueue()
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="terminal-reader", daemon=True)
        self._writer = threading.Thread(target=self._write, name="terminal-writer", daemon=True)

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    # -- browser -> terminal ------------------------------------------------------------------
    def _queue(self, item: bytes | tuple[int, int], cost: int) -> bool:
        with self._cond:
            if self._closed:
                return True  # the session is over: nothing more reaches the shell
            if self._input_pending >= MAX_PENDING_INPUT_BYTES:
                self._input_full = True
                return False
            self._input_pending += cost
        self.last_input = time.monotonic()
        self._inbox.put(item)
        return True

    def input(self, data: bytes) -> bool:
        """Queue keystrokes for the shell; False, queuing nothing, while
        ``MAX_PENDING_INPUT_BYTES`` are already waiting (offer them again after ``on_room``)."""
        return self._queue(data, len(data)) if data else True

    def resize(self, cols: Any, rows: Any) -> bool:
        """Queue a resize (as ``input``: False while the input is full)."""
        return self._queue(clamp_size(cols, rows), RESIZE_COST)

    @property
    def input_pending(self) -> int:
        with self._cond:
            return self._input_pending

    def idle_for(self) -> float:
        return time.monotonic() - self.last_input

    def _write(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            try:
                if isinstance(item, tuple):
                    self.shell.resize(*item)
                else:
                    self.shell.send(item)
            except DriverError:
                pass  # the terminal ended: the reader reports it
            finally:
                self._sent(RESIZE_COST if isinstance(item, tuple) else len(item))

    def _sent(self, cost: int) -> None:
        with self._cond:
            self._input_pending = max(0, self._input_pending - cost)
            wake = self._input_full and self._input_pending < MAX_PENDING_INPUT_BYTES
            if wake:
                self._input_full = False
        if wake and self._on_room is not None:
            self._on_room()

    # -- terminal -> browser ------------------------------------------------------------------
    def delivered(self, count: int) -> None:
        with self._cond:
            self._pending = max(0, self._pending - count)
            self._cond.notify_all()

    def _read(self) -> None:
        try:
            while not self._stop.is_set():
                with self._cond:
                    while self._pending > MAX_PENDING_BYTES and not self._stop.is_set():
                        self._cond.wait(1.0)
                if self._stop.is_set():
                    return
                data = self.shell.recv(READ_WAIT_SECONDS)
                if data is None:
                    break
                if data:
                    with self._cond:
                        self._pending += len(data)
                    self._on_output(data)
        except Exception:  # a driver bug must not end the process: the session just ends
            logger.exception("terminal reader of %s failed", self.grant.public_id)
        if not self._stop.is_set():
            self._on_output(None)

    # -- the end ------------------------------------------------------------------------------
    def stop(self) -> int:
        """End the session (idempotent): stop the threads, close the shell (a hangup for what
        runs in it), free the user's slot. Returns how long it lasted, in seconds. Touches no
        database (``record_closed`` does)."""
        seconds = int(round(time.monotonic() - self._started))
        with self._cond:
            if self._closed:
                return seconds
            self._closed = True
            self._stop.set()
            self._cond.notify_all()
        self._inbox.put(None)
        try:
            self.shell.close()
        except Exception:  # closing a broken channel: nothing more to do
            logger.debug("closing a terminal", exc_info=True)
        finally:
            _unreserve(self.grant.user_id)
        return seconds


def open_shell(grant: TerminalGrant, cols: Any, rows: Any) -> Shell:
    """Take one of the user's slots and open the driver's shell (blocking: the SSH connection;
    no database). Raises ``TerminalRefused``: too_many, or unavailable (``detail``: the driver's
    error code)."""
    if not _reserve(grant.user_id):
        raise TerminalRefused("too_many")
    c, r = clamp_size(cols, rows)
    try:
        driver: Any = get_driver(grant.driver)
        shell: Shell = driver.open_shell(grant.spec, grant.node, c, r, gpu_model=grant.gpu_model)
    except DriverError as exc:
        _unreserve(grant.user_id)
        raise TerminalRefused("unavailable", exc.code) from None
    except Exception as exc:  # a driver bug: the page says "unavailable", the log says why
        _unreserve(grant.user_id)
        logger.exception("opening a terminal on %s failed", grant.node.hostname)
        raise TerminalRefused("unavailable", type(exc).__name__) from None
    return shell


def record_opened(grant: TerminalGrant) -> None:
    """Who opened a terminal on which node; an operator's access is a warning naming them."""
    if grant.operator:
        _record(grant, "terminal_operator_opened", {}, level=EventLevel.WARNING)
    else:
        _record(grant, "terminal_opened", {}, level=EventLevel.INFO)


def record_failed(grant: TerminalGrant, error: str) -> None:
    _record(grant, "terminal_failed", {"error": error}, level=EventLevel.WARNING)


def record_closed(grant: TerminalGrant, reason: str, seconds: int) -> None:
    """How the session ended and how long it lasted (never what was typed)."""
    params: dict[str, Any] = {"seconds": seconds}
    if reason == "idle":
        params["idle"] = idle_seconds()
    _record(grant, CLOSE_EVENTS.get(reason, "terminal_closed"), params, level=EventLevel.INFO)


def _record(grant: TerminalGrant, code: str, params: dict[str, Any], *, level: str) -> None:
    instance = Instance.objects.filter(pk=grant.instance_id).first()
    if instance is None:
        return
    record_event(
        instance,
        EventKind.STATE,
        code=code,
        node=grant.node.hostname,
        level=level,
        params={"user": grant.user_name, "rank": grant.rank, "operator": grant.operator, **params},
    )
