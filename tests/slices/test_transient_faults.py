"""Transient faults in production mode (PostgreSQL, a private Redis, separate worker and beat
processes): the console's database backends terminated during provisioning, settlement and a
release, and a worker killed (SIGKILL) during a release.

- Provisioning: the drive is retried in place; the instances reach running, billed once.
- Settlement: the run blocked on a wallet lock has its connection cut, retries, and charges;
  every charge contiguous, nothing lost or doubled, ``billing_reconcile`` clean.
- Release: the teardown retries the step that met the error and completes without the
  reconciler; billing was closed at the release second.
- A worker killed mid-release: its lease lapses (the heartbeat stopped with it) and the take-over
  beat hands the release to a new worker; the GPUs are free within 30 s of the kill.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from celery import Celery

from tests.support import servers

pytestmark = pytest.mark.integration

# One Django start-up: the schema, the shipped fleet (no catalogue: nothing here mounts any), a
# funded customer and two orders, a 64-card slice and an 8-card host.
SETUP_AND_ORDER = """
from decimal import Decimal
from django.core.management import call_command
call_command("migrate", interactive=False, verbosity=0)
call_command("load_fleet", verbosity=0)
from billing import services as billing
from console.models import User
from console.services import mark_email_verified
from slices import services
u = User.objects.create_user("demo", "demo@example.com", "demo-password-2026")
mark_email_verified(u)
# A 64-card slice needs real-name verification (issue 33): the sandbox decides at once.
from console.verification import services as verification
verification.submit_personal(u, real_name="演示用户", id_number="11010519491231002X")
billing.grant_voucher(u, Decimal("20000"), reason="test", valid_days=30)
for cards, name in ((64, "blip-slice"), (8, "blip-host")):
    i, _ = services.order_instance(u, services.OrderRequest(gpu_model="A800", cards=cards, name=name))
    print(i.pk, i.public_id)
"""

RELEASE = (
    "from slices import services; from slices.models import Instance; "
    "services.release_instance(Instance.objects.get(id={iid}), by='test')"
)

WAITING = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND wait_event_type = 'Lock'"
)

TERMINATE = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


@dataclass
class World:
    stack: servers.Stack
    url: str
    redis_url: str
    slice: tuple[int, str]  # pk, public id
    host: tuple[int, str]

    def worker_log(self) -> str:
        return "\n".join(
            p.log.read_text(errors="replace") for p in self.stack.procs if p.name == "worker"
        )

    def kill_worker(self) -> float:
        """SIGKILL the worker's whole process group (a crash); returns when (monotonic)."""
        worker = next(p for p in reversed(self.stack.procs) if p.name == "worker")
        os.killpg(worker.popen.pid, signal.SIGKILL)
        worker.popen.wait(timeout=30)
        killed = time.monotonic()
        worker.log.rename(worker.log.with_name("worker-killed.log"))  # the next one logs afresh
        self.stack.procs.remove(worker)
        return killed

    def send(self, task: str) -> None:
        """Queue a task by name, as beat does (no Django start-up in this process)."""
        app = Celery("client", broker=self.redis_url, set_as_current=False)
        try:
            app.send_task(task)
        finally:
            app.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    tmp = tmp_path
    redis_proc, redis_url = servers.start_redis(tmp)
    url = servers.create_postgres_database(os.environ["DATABASE_URL"])
    env = servers.production_env(url, redis_url)
    # Settlement only when the test asks (the beat's hourly tick never comes); the default lease
    # and take-over timings (15 s, 5 s) are the ones under test.
    env.update(
        SIM_TIME_SCALE="0.1", SLICES_RETRY_BACKOFF_SECONDS="0", BILLING_SETTLEMENT_INTERVAL="3600"
    )
    stack = servers.Stack(env=env, port=servers.free_port(), tmp=tmp)
    try:
        stack.spawn(
            "beat",
            str(servers.BIN / "celery"),
            "-A",
            "console",
            "beat",
            "--loglevel",
            "INFO",
            "--schedule",
            str(tmp / "celerybeat-schedule"),
        )
        lines = servers.manage(env, "shell", "-c", SETUP_AND_ORDER).strip().splitlines()[-2:]
        (slice_pk, slice_id), (host_pk, host_id) = (line.split() for line in lines)
        stack.start_worker()  # the orders' provisioning waits in the queue for it
        yield World(stack, url, redis_url, (int(slice_pk), slice_id), (int(host_pk), host_id))
    finally:
        stack.stop()
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
        servers.drop_postgres_database(url)


def _query(url: str, sql: str, *args: object) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, args).fetchall()


def _one(url: str, sql: str, *args: object) -> object:
    return _query(url, sql, *args)[0][0]


def _wait(predicate: Callable[[], bool], timeout: float, what: str, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


def _state(url: str, iid: int) -> str:
    return str(_one(url, "SELECT state FROM slices_instance WHERE id = %s", iid))


def _codes(url: str, iid: int) -> list[str]:
    return [
        r[0]
        for r in _query(
            url, "SELECT code FROM slices_instanceevent WHERE instance_id = %s ORDER BY id", iid
        )
    ]


def _sessions(url: str, public_id: str) -> list[tuple]:
    return _query(
        url,
        "SELECT id, state, started_at, ended_at, close_reason, settled_seconds, charged, wallet_id "
        "FROM billing_usagesession WHERE resource_id = %s AND meter = 'gpu'",
        public_id,
    )


def _waiting(url: str) -> bool:
    """Some backend of the console waits on a row lock (one this test holds)."""
    return int(_one(url, WAITING)) > 0  # type: ignore[call-overload]


@contextmanager
def _holding(url: str, table: str, pk: int) -> Iterator[psycopg.Connection]:
    """A row locked (FOR UPDATE) in a transaction of this test: the console's writer of that row
    waits, so a fault lands at a known step. The lock goes when the block ends."""
    with psycopg.connect(url) as conn:
        conn.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", (pk,))  # noqa: S608
        yield conn
        conn.rollback()


def test_database_blips_and_a_dead_worker_fail_nothing_and_lose_nothing(world: World) -> None:
    """One story, in order (each part needs the state the one before left)."""
    _blip_mid_provisioning(world)
    _blip_during_settlement(world)
    _blip_during_release(world)
    _worker_killed_mid_release(world)
    # The books of the whole story: sessions against postings, balances (exits 1 on a problem).
    servers.manage(world.stack.env, "billing_reconcile")


def _blip_mid_provisioning(world: World) -> None:
    """The instances reach running, billed once; the drive met the cut and retried."""
    url = world.url
    iid = world.slice[0]
    _wait(
        lambda: any(
            r[0] in ("mount", "start")
            for r in _query(url, "SELECT step FROM slices_instancenode WHERE instance_id = %s", iid)
        ),
        120,
        "provisioning to get going",
    )
    assert _query(url, TERMINATE)  # the worker's connections among them
    time.sleep(1.5)
    _query(url, TERMINATE)  # and again, while it resumes
    for pk, public_id in (world.slice, world.host):
        _wait(lambda pk=pk: _state(url, pk) in ("running", "failed"), 120, "provisioning")
        assert _state(url, pk) == "running", _codes(url, pk)
        codes = _codes(url, pk)
        assert "failed" not in codes and codes.count("running") == 1
        assert codes.count("billing_started") == 1
        assert [s[1] for s in _sessions(url, public_id)] == ["open"]  # billed once
    assert "attempt 2 of 5" in world.worker_log()  # the blip was met, and retried


def _blip_during_settlement(world: World) -> None:
    """The run waiting on a wallet lock has its connection cut, retries, and charges."""
    url = world.url
    sessions = [s for _pk, pid in (world.slice, world.host) for s in _sessions(url, pid)]
    assert len(sessions) == 2 and all(s[1] == "open" for s in sessions)
    wallet = sessions[0][7]
    with psycopg.connect(url) as holder:
        # Hold the wallet's lock, so the settlement run waits on it; then cut its connection.
        holder.execute("SELECT id FROM billing_wallet WHERE id = %s FOR UPDATE", (wallet,))
        world.send("billing.tasks.settle_usage_task")
        _wait(lambda: _waiting(url), 30, "the settlement to wait on the wallet")
        assert holder.execute(TERMINATE).fetchall()
        cut = _one(url, "SELECT now()")
        # The retry finds the lock still held and waits again; then let go.
        _wait(lambda: _waiting(url), 30, "the retried settlement to wait again")
        holder.rollback()
    ids = [s[0] for s in sessions]

    def settled_after_the_cut() -> bool:
        rows = _query(url, "SELECT settled_at FROM billing_usagesession WHERE id = ANY(%s)", ids)
        return all(r[0] is not None and r[0] > cut for r in rows)

    _wait(settled_after_the_cut, 30, "the retried settlement to charge")
    assert "settling usage: OperationalError" in world.worker_log()
    for s in sessions:
        _charges_are_contiguous(url, s[0])


def _charges_are_contiguous(url: str, session_id: int) -> None:
    charges = _query(
        url,
        "SELECT from_second, to_second, amount FROM billing_usagecharge WHERE session_id = %s "
        "ORDER BY from_second",
        session_id,
    )
    settled, charged = _query(
        url, "SELECT settled_seconds, charged FROM billing_usagesession WHERE id = %s", session_id
    )[0]
    assert charges and charges[0][0] == 0
    assert all(
        a[1] == b[0] for a, b in zip(charges, charges[1:], strict=False)
    )  # no gap, no overlap
    assert charges[-1][1] == settled and sum(c[2] for c in charges) == charged


def _blip_during_release(world: World) -> None:
    """The teardown retries in place (no reconciler); billing closed at the release second."""
    url, (iid, public_id) = world.url, world.slice
    alloc = _one(url, "SELECT allocation_id FROM slices_instance WHERE id = %s", iid)
    with _holding(url, "slices_allocation", alloc) as holder:
        # The nodes are cleaned, then freeing the GPUs waits on the allocation: cut it there.
        servers.manage(world.stack.env, "shell", "-c", RELEASE.format(iid=iid))
        _wait(lambda: _waiting(url), 30, "the teardown to free the GPUs")
        assert holder.execute(TERMINATE).fetchall()
        _wait(lambda: _waiting(url), 30, "the retried teardown")
    _wait(lambda: _state(url, iid) != "releasing", 60, "the release to complete")
    codes = _codes(url, iid)
    assert _state(url, iid) == "released", codes
    assert "redriven" not in codes  # completed by the retry in place, not by the reconciler
    assert f"tearing down {public_id}: OperationalError" in world.worker_log()
    assert _one(url, "SELECT state FROM slices_allocation WHERE id = %s", alloc) == "released"
    released_at = _one(
        url,
        "SELECT at FROM slices_instanceevent WHERE instance_id = %s AND code = 'release_requested'",
        iid,
    )
    [(_sid, state, started, ended, reason, seconds, _charged, _wallet)] = _sessions(url, public_id)
    assert (state, reason) == ("closed", "released")
    assert isinstance(ended, datetime) and isinstance(released_at, datetime)
    assert abs((ended - released_at).total_seconds()) < 1  # billing stopped at the release
    assert seconds == int((ended - started).total_seconds())


def _worker_killed_mid_release(world: World) -> None:
    """The worker dies mid-release; its lease lapses (15 s; its heartbeat died with it) and the
    take-over beat (every 5 s) hands the release to another worker: GPUs free within 30 s."""
    url, (iid, public_id) = world.url, world.host
    alloc = _one(url, "SELECT allocation_id FROM slices_instance WHERE id = %s", iid)
    with _holding(url, "slices_allocation", alloc):
        servers.manage(world.stack.env, "shell", "-c", RELEASE.format(iid=iid))
        _wait(lambda: _waiting(url), 30, "the teardown to free the GPUs")
        killed = world.kill_worker()  # mid-release, its transaction open
    world.stack.start_worker()  # another worker (the Procfile's run several)
    _wait(
        lambda: _one(url, "SELECT state FROM slices_allocation WHERE id = %s", alloc) == "released",
        60,
        "the GPUs to be freed",
    )
    freed_after = time.monotonic() - killed
    assert freed_after < 30, freed_after
    codes = _codes(url, iid)
    assert _state(url, iid) == "released" and "redriven" in codes, codes
    assert [s[1] for s in _sessions(url, public_id)] == ["closed"]
    held = _query(
        url,
        "SELECT an.node_id, an.gpu_mask FROM slices_allocationnode an JOIN slices_allocation a "
        "ON a.id = an.allocation_id WHERE a.state = 'active'",
    )
    masks = dict(_query(url, "SELECT id, free_mask FROM slices_node"))
    assert all(masks[node] & mask == 0 for node, mask in held)  # no GPU double-booked
