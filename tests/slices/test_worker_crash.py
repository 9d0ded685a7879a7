"""A Celery worker killed (SIGKILL) mid-provisioning, in production mode (PostgreSQL, Redis, a
separate worker process): after a restart and the reconciler, the instance ends running with one
billing start, or failed with everything freed; no GPU leaks, nothing is charged twice."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.support import servers

pytestmark = pytest.mark.integration

ORDER = """
from decimal import Decimal
from billing import services as billing
from console.models import User
from slices import services
u = User.objects.get(username="demo")
billing.grant_voucher(u, Decimal("5000"), reason="test", valid_days=30)
i, _ = services.order_instance(u, services.OrderRequest(gpu_model="A800", cards=64, name="crash"))
print(i.public_id)
"""


@pytest.fixture
def stack(tmp_path) -> Iterator[tuple[servers.Stack, str]]:
    database_url = servers.create_postgres_database(os.environ["DATABASE_URL"])
    env = servers.production_env(database_url, os.environ["REDIS_URL"])
    env.update(SIM_TIME_SCALE="0.15", SLICES_LEASE_SECONDS="3", SLICES_RETRY_BACKOFF_SECONDS="0")
    stack = servers.Stack(env=env, port=servers.free_port(), tmp=tmp_path)
    try:
        servers.manage(env, "migrate", "--noinput", "-v", "0")
        servers.manage(env, "demo_setup")
        yield stack, database_url
    finally:
        stack.stop()
        servers.drop_postgres_database(database_url)


def _query(url: str, sql: str, *args: object) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, args).fetchall()


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_worker_killed_mid_provisioning_finishes_cleanly(stack) -> None:
    stack, url = stack
    stack.start_worker()
    public_id = servers.manage(stack.env, "shell", "-c", ORDER).strip().splitlines()[-1]
    iid = _query(url, "SELECT id FROM slices_instance WHERE public_id = %s", public_id)[0][0]
    before = _kill_the_worker_mid_provisioning(stack, url, iid)
    state, alloc_id = _redrive_until_settled(stack, url, iid)
    _settled_once(url, iid, public_id, state, before)
    _no_gpu_double_booked(url)
    _release_frees_the_gpus(stack, url, iid, alloc_id, public_id)


def _steps(url: str, iid: int) -> list[str]:
    return [
        r[0]
        for r in _query(url, "SELECT step FROM slices_instancenode WHERE instance_id = %s", iid)
    ]


def _kill_the_worker_mid_provisioning(stack: servers.Stack, url: str, iid: int) -> list[str]:
    """Kill the worker once some nodes are past "prepare" (mid-provisioning); returns the nodes'
    steps at that moment."""
    _wait(
        lambda: any(s in ("mount", "start") for s in _steps(url, iid)),
        120,
        "provisioning to get going",
    )
    worker = stack.procs[-1]
    os.killpg(worker.popen.pid, signal.SIGKILL)
    worker.popen.wait(timeout=10)
    stack.procs.remove(worker)
    state = _query(url, "SELECT state FROM slices_instance WHERE id = %s", iid)[0][0]
    assert state == "provisioning"
    return _steps(url, iid)


def _redrive_until_settled(stack: servers.Stack, url: str, iid: int) -> tuple[str, int]:
    """A new worker; the reconciler re-drives the instance once its lease expired. Returns the
    state it settled in and its allocation."""
    stack.start_worker()
    time.sleep(7)  # lease (3 s) and the reconciler's grace (the lease again) must pass
    servers.manage(stack.env, "reconcile_instances")
    _wait(
        lambda: (
            _query(url, "SELECT state FROM slices_instance WHERE id = %s", iid)[0][0]
            in ("running", "failed")
        ),
        180,
        "the instance to settle",
    )
    state, alloc_id = _query(
        url, "SELECT state, allocation_id FROM slices_instance WHERE id = %s", iid
    )[0]
    return state, alloc_id


def _settled_once(url: str, iid: int, public_id: str, state: str, before: list[str]) -> None:
    """Re-driven, billed once if it runs (nodes resumed after their last recorded step)."""
    events = [
        r[0]
        for r in _query(
            url,
            "SELECT code FROM slices_instanceevent WHERE instance_id = %s AND kind = 'state'",
            iid,
        )
    ]
    assert "redriven" in events
    sessions = _query(
        url, "SELECT state FROM billing_usagesession WHERE resource_id = %s", public_id
    )
    if state == "running":
        assert len(sessions) == 1  # exactly one billing start
        # Nodes resumed after their last recorded step (not from the beginning).
        assert all(s == "ready" for s in _steps(url, iid)) and before
    else:
        assert sessions == []


def _no_gpu_double_booked(url: str) -> None:
    """No GPU double-booked or leaked: masks agree with active allocations."""
    held = _query(
        url,
        "SELECT an.node_id, an.gpu_mask FROM slices_allocationnode an JOIN slices_allocation a "
        "ON a.id = an.allocation_id WHERE a.state = 'active'",
    )
    masks = dict(_query(url, "SELECT id, free_mask FROM slices_node"))
    for node_id, mask in held:
        assert masks[node_id] & mask == 0


def _release_frees_the_gpus(
    stack: servers.Stack, url: str, iid: int, alloc_id: int, public_id: str
) -> None:
    """Release: billing closes, GPUs come back."""
    servers.manage(
        stack.env,
        "shell",
        "-c",
        f"from slices import services; from slices.models import Instance; "
        f"services.release_instance(Instance.objects.get(id={iid}), by='test')",
    )
    _wait(
        lambda: (
            _query(url, "SELECT state FROM slices_instance WHERE id = %s", iid)[0][0]
            in ("released", "failed")
        ),
        120,
        "the release",
    )
    _wait(
        lambda: (
            _query(url, "SELECT state FROM slices_allocation WHERE id = %s", alloc_id)[0][0]
            == "released"
        ),
        120,
        "the GPUs to be freed",
    )
    assert all(
        s[0] == "closed"
        for s in _query(
            url, "SELECT state FROM billing_usagesession WHERE resource_id = %s", public_id
        )
    )
