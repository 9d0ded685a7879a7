"""The channel layer from synchronous code, over one event loop per process.

``async_to_sync(layer.group_send)(...)`` called from a thread that runs no event loop (a Celery
task, the embedded worker's threads, the telemetry relay) starts a new thread and a new event loop
for that one call, and channels-redis, whose connections belong to a loop, opens a new Redis
connection for it. Provisioning a 64-card slice broadcasts about 150 messages (each step of each
node, its log lines, its state), the relay one batch a second: each of them paid for a thread, a
loop and, in production, a TCP connection, on the thread that also records every node's steps
(``bench/provisioning.py``).

Here one daemon thread per process runs one loop for all of them:

- ``run(coro)`` runs a coroutine there and blocks until it is done, as ``async_to_sync`` did (the
  relay's sends, whose outcome the relay reports);
- ``post(coro)`` queues a coroutine and returns at once: the queue runs one at a time, in the
  order posted, each bounded by its timeout; what one raises is logged (at debug) and dropped.
  For best-effort broadcasts (``slices.events``): the recording thread no longer waits for the
  channel layer between two nodes' steps. ``flush()`` waits until everything posted has run.

A forked child (Celery's prefork pool) starts its own thread on first use; a process that exits
gives what it posted up to ``EXIT_FLUSH_SECONDS`` to go out. From code that runs an event loop,
await the coroutine instead.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Posted coroutines waiting at most (a channel layer that hangs while callers keep posting):
# beyond that, new ones are dropped, as a channel layer may drop a message.
MAX_POSTED = 10_000
EXIT_FLUSH_SECONDS = 2.0

_Posted = tuple[Coroutine[Any, Any, Any], float, str]


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.queue: asyncio.Queue[_Posted] = asyncio.Queue(maxsize=MAX_POSTED)
        self.thread = threading.Thread(target=self._serve, name="channel-layer-loop", daemon=True)
        self.pid = os.getpid()
        self.thread.start()

    def usable(self) -> bool:
        return self.pid == os.getpid() and self.thread.is_alive() and not self.loop.is_closed()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.create_task(self._drain())
        self.loop.run_forever()

    async def _drain(self) -> None:
        while True:
            coro, timeout, what = await self.queue.get()
            try:
                async with asyncio.timeout(timeout):
                    await coro
            except Exception:  # best effort: the caller has moved on
                logger.debug("%s dropped", what or "a posted channel-layer call", exc_info=True)
            finally:
                self.queue.task_done()

    def put(self, item: _Posted) -> None:
        """In the loop's thread."""
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            item[0].close()
            logger.debug("%s dropped: %d calls already waiting", item[2], MAX_POSTED)


_lock = threading.Lock()
_current: _LoopThread | None = None


def _forget_after_fork() -> None:
    global _lock, _current
    _lock, _current = threading.Lock(), None


os.register_at_fork(after_in_child=_forget_after_fork)


def _loop_thread() -> _LoopThread:
    global _current
    with _lock:
        if _current is None or not _current.usable():
            _current = _LoopThread()
        return _current


def _refuse_in_async(coro: Coroutine[Any, Any, Any], what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    coro.close()
    raise RuntimeError(f"layer_loop.{what}() is for synchronous code: await the coroutine")


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the process's layer loop and return its result (or raise its error);
    ``TimeoutError`` (the coroutine cancelled) after ``timeout`` seconds."""
    _refuse_in_async(coro, "run")
    future = asyncio.run_coroutine_threadsafe(coro, _loop_thread().loop)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"a channel-layer call took more than {timeout} s") from None


def post(coro: Coroutine[Any, Any, Any], timeout: float, what: str = "") -> None:
    """Queue ``coro`` on the process's layer loop (run after everything posted before it, within
    ``timeout`` seconds) and return at once."""
    _refuse_in_async(coro, "post")
    current = _loop_thread()
    current.loop.call_soon_threadsafe(current.put, (coro, timeout, what))


def flush(timeout: float = 10.0) -> None:
    """Wait until everything posted so far has run (or ``timeout`` seconds)."""
    current = _loop_thread()

    async def drained() -> None:
        await current.queue.join()

    run(drained(), timeout)


@atexit.register
def _flush_at_exit() -> None:
    if _current is not None and _current.usable():
        try:
            flush(EXIT_FLUSH_SECONDS)
        except TimeoutError:
            logger.debug("channel-layer calls still queued at exit were dropped")
