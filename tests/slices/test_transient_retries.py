"""Transient infrastructure errors in background work, in process (the production-mode faults
are tests/slices/test_transient_faults.py): a database error met while provisioning, tearing down
or settling is retried, never turned into a failed instance or a lost settlement; the lease's
heartbeat; the timings that make recovery fast and redelivery safe.

Faults are injected at the database boundary (``connection.execute_wrapper`` raising
``OperationalError`` for one statement, as a terminated backend does); transactional tests, so
the retried work runs outside any test transaction as it does in a worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.utils import timezone

from billing import services as billing
from billing.models import PriceBook, UsageSession
from billing.seed import seed_default_prices
from billing.tasks import settle_usage_task
from console.celery import app as celery_app
from console.retries import TRANSIENT_ERRORS, TransientRetryTask, retry_transient
from slices import services
from slices.choices import InstanceState
from slices.models import Allocation, Instance
from slices.services import provisioning

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _prices(transactional_db) -> None:
    if not PriceBook.objects.exists():
        seed_default_prices()  # transactional tests flush the migration-seeded price book


@contextmanager
def fail_once(fragment: str) -> Iterator[list[str]]:
    """The first statement containing ``fragment`` fails as if its backend were terminated;
    yields the statements that failed."""
    failed: list[str] = []

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, ctx: Any) -> Any:
        if fragment in sql and not failed:
            failed.append(sql)
            raise OperationalError("terminating connection due to administrator command")
        return execute(sql, params, many, ctx)

    with connection.execute_wrapper(wrapper):
        yield failed


def _order(user: Any, **kw: Any) -> Instance:
    """Order and provision (the task runs inline on commit)."""
    instance, _ = services.order_instance(
        user, services.OrderRequest(**{"gpu_model": "RTX4090", "cards": 8, **kw})
    )
    instance.refresh_from_db()
    return instance


def _codes(instance: Instance) -> list[str]:
    return list(instance.events.order_by("id").values_list("code", flat=True))


@pytest.mark.parametrize(
    "fragment",
    [
        '"step_started_at" = ',  # recording a finished step
        '"running_at" = ',  # the move to running, with billing's start, in one transaction
    ],
)
def test_a_database_error_while_provisioning_is_retried_not_failed(
    sim_fleet, funded, fragment
) -> None:
    with fail_once(fragment) as failed:
        instance = _order(funded)
    assert failed  # the fault was met
    assert instance.state == InstanceState.RUNNING, _codes(instance)
    codes = _codes(instance)
    assert "failed" not in codes
    assert codes.count("provisioning") == 1 and codes.count("billing_started") == 1
    sessions = UsageSession.objects.filter(resource_id=str(instance.public_id))
    assert [s.state for s in sessions] == ["open"]  # billed once
    assert set(instance.nodes.values_list("step", flat=True)) == {"ready"}
    assert instance.lease_until is None  # let go


def test_a_database_error_while_tearing_down_is_retried(sim_fleet, funded) -> None:
    instance = _order(funded)
    allocation = Allocation.objects.get(pk=instance.allocation_id)
    with fail_once('UPDATE "slices_allocation"') as failed:
        assert services.release_instance(instance, by="alice")
    assert failed
    instance.refresh_from_db()
    allocation.refresh_from_db()
    assert instance.state == InstanceState.RELEASED, _codes(instance)
    assert allocation.state == "released" and instance.resources_freed_at is not None
    assert "redriven" not in _codes(instance)  # done in place, not by the reconciler


def test_a_database_error_while_settling_is_retried_and_charges_once(sim_fleet, funded) -> None:
    instance = _order(funded)
    session = UsageSession.objects.get(resource_id=str(instance.public_id))
    UsageSession.objects.filter(pk=session.pk).update(
        started_at=session.started_at - timedelta(seconds=90)
    )
    with fail_once('FROM "billing_wallet"') as failed:
        settle_usage_task.apply()
    assert failed
    session.refresh_from_db()
    assert session.settled_seconds >= 90
    charges = list(session.charges.order_by("from_second").values_list("from_second", "to_second"))
    assert charges == [(0, session.settled_seconds)]  # one charge: not lost, not doubled
    assert billing.reconcile() == []


def test_retry_transient_retries_only_transient_errors_and_only_outside_a_transaction() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("server closed the connection unexpectedly")
        return "done"

    assert retry_transient(flaky, what="test", backoff=0) == "done" and len(calls) == 3
    calls.clear()
    with pytest.raises(OperationalError):
        retry_transient(lambda: flaky() and flaky(), what="test", attempts=2, backoff=0)
    calls.clear()
    with pytest.raises(IntegrityError):  # not transient: at once
        retry_transient(
            lambda: calls.append(1) or (_ for _ in ()).throw(IntegrityError()), what="t"
        )
    assert len(calls) == 1
    calls.clear()
    with transaction.atomic(), pytest.raises(OperationalError):
        retry_transient(flaky, what="test", backoff=0)  # the transaction's owner retries
    assert len(calls) == 1


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_heartbeat_renews_the_lease_and_never_overrides_a_successor(
    sim_fleet, funded, settings
) -> None:
    settings.SLICES_LEASE_SECONDS = 2  # a beat every 0.4 s
    instance = _order(funded)
    assert provisioning.acquire_lease(instance)
    first = Instance.objects.get(pk=instance.pk).lease_until
    assert first is not None
    _wait(lambda: Instance.objects.get(pk=instance.pk).lease_until != first, "a renewal")
    assert not provisioning.acquire_lease(instance)  # held, and kept alive
    # Another worker took over (this one's lease had lapsed): it is not extended nor dropped.
    theirs = timezone.now() + timedelta(minutes=5)
    Instance.objects.filter(pk=instance.pk).update(lease_until=theirs)
    _wait(lambda: provisioning.lease_lost(instance), "the loss to be noticed")
    provisioning.drop_lease(instance)
    assert Instance.objects.get(pk=instance.pk).lease_until == theirs


def test_timings_recover_within_30_seconds_and_stay_below_the_visibility_timeout() -> None:
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    assert settings.CELERY_TASK_TIME_LIMIT < visibility  # never handed out twice while running
    lease = settings.SLICES_LEASE_SECONDS
    assert provisioning.heartbeat_seconds() * 5 <= lease  # five beats per lease
    # A dead worker's instance is taken over within lease + one take-over tick.
    assert lease + settings.SLICES_TAKEOVER_INTERVAL <= 20
    entries = settings.CELERY_BEAT_SCHEDULE.values()
    take_over = [e for e in entries if e["task"].endswith("take_over_instances_task")]
    assert [e["schedule"] for e in take_over] == [settings.SLICES_TAKEOVER_INTERVAL]
    # In-place retries (worst case, with jitter) end well inside the lease.
    from console import retries

    worst = sum(
        min(retries.MAX_DELAY_SECONDS, retries.BACKOFF_SECONDS * 2**i) * 1.25
        for i in range(retries.ATTEMPTS - 1)
    )
    assert worst < lease
    for entry in entries:
        options = entry["options"]
        assert options["retry"] and options["retry_policy"]["max_retries"] >= 3
        assert options["expires"] <= entry["schedule"]  # a late job gives way to the next
        assert options.get("countdown", 0) < visibility
    ours = [t for name, t in celery_app.tasks.items() if name.startswith(("slices.", "billing."))]
    assert len(ours) >= 12
    for task in ours:
        # Every background task re-queues itself on a transient error, far below the timeout.
        assert isinstance(task, TransientRetryTask), task.name
        assert set(TRANSIENT_ERRORS) <= set(task.autoretry_for), task.name
        assert task.retry_backoff_max * task.max_retries < visibility
        assert task.acks_late, task.name
