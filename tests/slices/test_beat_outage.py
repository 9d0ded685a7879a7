"""Beat and the worker through a broker outage, in production mode (PostgreSQL, a private Redis,
separate worker and beat processes).

Redis is killed for a few seconds and restarted on the same port, empty (a crash without
persistence). Beat keeps publishing its periodic jobs with retries, so the tick due during the
outage is sent once Redis is back rather than lost ("Message Error" / SchedulingError in its log);
both processes live on, and the periodic jobs run again. What a lost message would have carried
is re-derived from the database by the next tick (the reconciler's work), so nothing depends on
the queue's contents surviving.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support import servers

pytestmark = pytest.mark.integration

OUTAGE_S = 6.0  # below beat's publish retries (about 10 s): the due tick waits, then goes out


@dataclass
class Broker:
    stack: servers.Stack
    redis_url: str
    tmp: Path
    redises: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def log(self, name: str) -> str:
        proc = next(p for p in self.stack.procs if p.name == name)
        return proc.log.read_text(errors="replace")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    redis_proc, redis_url = servers.start_redis(tmp_path)
    url = servers.create_postgres_database(os.environ["DATABASE_URL"])
    env = servers.production_env(url, redis_url)
    stack = servers.Stack(env=env, port=servers.free_port(), tmp=tmp_path)
    world = Broker(stack, redis_url, tmp_path, [redis_proc])
    try:
        servers.manage(env, "migrate", "--noinput", "-v", "0")
        stack.start_worker()
        stack.spawn(
            "beat",
            str(servers.BIN / "celery"),
            "-A",
            "console",
            "beat",
            "--loglevel",
            "INFO",
            "--schedule",
            str(tmp_path / "celerybeat-schedule"),
        )
        yield world
    finally:
        stack.stop()
        for proc in world.redises:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)
        servers.drop_postgres_database(url)


def _wait(
    predicate: Callable[[], bool], timeout: float, what: str, log: Callable[[], str] = str
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}\n{log()[-4000:]}")


TOOK_OVER = re.compile(r"take_over_instances_task\[[0-9a-f-]+\] succeeded")


def test_beat_and_the_worker_ride_out_a_broker_outage(broker: Broker) -> None:
    _wait(lambda: bool(TOOK_OVER.search(broker.log("worker"))), 60, "the first take-over tick")
    redis = broker.redises[0]
    redis.send_signal(signal.SIGKILL)  # a crash: no shutdown, nothing saved
    redis.wait(timeout=10)
    time.sleep(OUTAGE_S)
    before = len(broker.log("worker"))
    port = urlsplit(broker.redis_url).port
    proc, _url = servers.start_redis(broker.tmp, port)
    broker.redises.append(proc)
    # The periodic jobs run again, through the same processes (neither gave up nor died).
    # The worker reconnects with kombu's back-off (2 s more per try) and, on a loaded machine,
    # once seen in a full integration run, took over 60 s: its log says where it was.
    _wait(
        lambda: bool(TOOK_OVER.search(broker.log("worker")[before:])),
        150,
        "a take-over tick after the outage",
        lambda: broker.log("worker")[before:] + "\n--- beat\n" + broker.log("beat"),
    )
    assert all(p.popen.poll() is None for p in broker.stack.procs)
    beat = broker.log("beat")
    assert "Message Error" not in beat and "SchedulingError" not in beat, beat[-3000:]
