"""The one source of "now" for billing, so tests can move time. No Django imports.

Services call ``billing.clock.now()``; tests install a ``FrozenClock`` with ``use_clock`` (or the
``billing_clock`` fixture) and ``advance`` it. Times are timezone-aware UTC.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    """Wall-clock time (UTC)."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class FrozenClock:
    """A clock that only moves when told to; for tests and the benchmark."""

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2026, 1, 1, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("FrozenClock needs a timezone-aware datetime")
        self._now = start

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float = 0, **kwargs: float) -> datetime:
        self._now += timedelta(seconds=seconds, **kwargs)
        return self._now

    def set(self, when: datetime) -> None:
        self._now = when


_clock: Clock = SystemClock()


def now() -> datetime:
    """The current time according to the installed clock."""
    return _clock.now()


def get_clock() -> Clock:
    return _clock


def set_clock(clock: Clock) -> Clock:
    """Install ``clock``; returns the previous one."""
    global _clock
    previous, _clock = _clock, clock
    return previous


@contextmanager
def use_clock(clock: Clock) -> Iterator[Clock]:
    previous = set_clock(clock)
    try:
        yield clock
    finally:
        set_clock(previous)
