"""Race helpers for the PostgreSQL concurrency tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection


def race(n: int, work: Callable[[int], Any], timeout: float = 120) -> list[Any]:
    """Run ``work(i)`` in ``n`` threads released together by a barrier.

    Each thread uses (and closes) its own database connection. Returns each call's result or the
    exception it raised, in index order; a thread still running after ``timeout`` fails the test
    (a deadlock or a lock never released).
    """
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as exc:  # returned to the caller, which asserts on it
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung (deadlock?)"
    return results
