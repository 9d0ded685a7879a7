"""Transient infrastructure errors: what they are, and one way to retry them.

A database backend terminated, PostgreSQL restarting, a full connection pool, Redis (the broker,
the cache, the channel layer) unreachable for a moment: none of these says anything about the
customer's order, so background work retries the step that met one instead of failing the
instance or dropping a settlement. Everything retried this way is safe to run twice (compare-and-
set transitions, settlements idempotent per session and second), so a step whose commit reached
the database but whose answer was lost is simply found done on the retry.

Two layers, one list of errors:

- ``retry_transient(fn)``: inside a service, retry one step in place with exponential backoff,
  after closing this thread's broken connections (the next query opens a new one). Used outside
  ``transaction.atomic`` only: inside one, the error goes up to the caller that owns the
  transaction, which retries the whole of it.
- ``TransientRetryTask``: the Celery base class of every background task; a transient error that
  outlived the in-place retries re-queues the task with backoff (``autoretry_for``), far below
  the broker's visibility timeout (tests/slices/test_transient_retries.py asserts it).

Driver errors (``slices.drivers.DriverError``) are not transient in this sense: they keep their
own retry rules (slices/services/provisioning.py).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

import kombu.exceptions
import redis.exceptions
from celery import Task
from django.db import InterfaceError, OperationalError, connections

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Database: a terminated backend, a restart, "too many clients", a pool timeout (psycopg_pool's
# PoolTimeout is a psycopg OperationalError, which Django wraps), a deadlock or serialization
# failure. Redis and the broker: the client's connection errors and kombu's publish failure.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    OperationalError,
    InterfaceError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    kombu.exceptions.OperationalError,
)

# In-place retries: 0.5, 1, 2, 4 s (+ up to a quarter of jitter) between five attempts, about
# 9 s at most: well inside an instance's lease (SLICES_LEASE_SECONDS, 15 s), so a blip never
# hands the instance to another worker.
ATTEMPTS = 5
BACKOFF_SECONDS = 0.5
MAX_DELAY_SECONDS = 4.0


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT_ERRORS)


def close_connections() -> None:
    """Close this thread's database connections (outside a transaction), so the next query opens
    a fresh one instead of failing again on a connection the server has cut."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            try:
                conn.close()
            except Exception:  # closing a dead connection may raise; it is closed either way
                logger.debug("closing %s raised", conn.alias, exc_info=True)


def backoff_delay(attempt: int, backoff: float, max_delay: float) -> float:
    """The pause after failed attempt number ``attempt`` (1-based): exponential, capped, with up
    to a quarter of jitter so workers cut off together do not come back together."""
    delay = min(max_delay, backoff * 2 ** (attempt - 1))
    return delay + random.uniform(0, delay / 4)  # noqa: S311 (jitter, not a secret)


def retry_transient(
    fn: Callable[[], T],
    *,
    what: str,
    attempts: int = ATTEMPTS,
    backoff: float = BACKOFF_SECONDS,
    max_delay: float = MAX_DELAY_SECONDS,
) -> T:
    """``fn()``, retried up to ``attempts`` times in all while it raises a transient error; the
    last error goes to the caller. ``fn`` must be safe to run again after an error (idempotent,
    or one transaction that rolled back). Inside a transaction nothing is retried here: the
    connection is unusable until the outermost block ends, so the owner of that block retries."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except TRANSIENT_ERRORS as exc:
            if attempt >= attempts or any(
                c.in_atomic_block for c in connections.all(initialized_only=True)
            ):
                raise
            delay = backoff_delay(attempt, backoff, max_delay)
            logger.warning(
                "%s: %s (%s); attempt %d of %d in %.1f s",
                what,
                type(exc).__name__,
                str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                attempt + 1,
                attempts,
                delay,
            )
            close_connections()
            time.sleep(delay)
    raise AssertionError("unreachable")  # the loop returns or raises


class TransientRetryTask(Task):
    """Base class of the background tasks: a transient error that outlived the service's own
    retries re-queues the task (countdown 2, 4, 8, 16, 30 s, with jitter), at most 5 times. The
    Django fixup closes the worker's connections after every run, so the retry starts afresh.
    A task whose re-queueing itself fails (the broker is down) is re-driven from the database by
    the reconciler or the next beat tick: nothing here is the only copy of any work."""

    autoretry_for = TRANSIENT_ERRORS
    retry_backoff = 2
    retry_backoff_max = 30
    retry_jitter = True
    max_retries = 5
