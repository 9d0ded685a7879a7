"""排队 admission racing on PostgreSQL (SQLite ignores row locks): releases and admissions at
once start each freed slot's queued order exactly once, and never give one GPU twice."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing import services as billing
from billing.seed import seed_default_prices
from console.notices.models import Notice
from slices import services
from slices.choices import InstanceState
from slices.models import Allocation, Instance, Node
from slices.services import queue
from tests.slices.factories import load_small_fleet
from tests.support.concurrency import race

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def world(settings, alice, bob):
    settings.SIM_TIME_SCALE = 0
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    load_small_fleet()
    seed_default_prices()  # transactional tests flush the migration-seeded price book
    for user in (alice, bob):
        billing.grant_voucher(user, Decimal("100000"), reason="test", valid_days=30)


def _order(user, name: str, when: str = "") -> Instance:
    req = services.OrderRequest(gpu_model="RTX4090", cards=8, name=name, when_unavailable=when)
    return services.order_instance(user, req)[0]


def test_concurrent_releases_and_admissions_start_each_order_once(world, alice, bob):
    fillers = [_order(alice, f"fill{i}") for i in range(2)]  # both RTX4090 nodes
    waiting = [_order(bob if i % 2 else alice, f"q{i}", "queue") for i in range(3)]
    assert all(w.state == InstanceState.QUEUED for w in waiting)

    def work(i: int):
        if i < 2:
            return services.release_instance(Instance.objects.get(pk=fillers[i].pk), by="alice")
        return queue.admit("RTX4090")

    results = race(8, work)
    assert not [r for r in results if isinstance(r, Exception)], results
    queue.admit("RTX4090")  # what a late task would do: nothing more
    states = {w.name: Instance.objects.get(pk=w.pk).state for w in waiting}
    started = [n for n, s in states.items() if s != InstanceState.QUEUED]
    # FIFO: the two oldest took the two freed nodes; the third still waits.
    assert sorted(started) == ["q0", "q1"], states
    assert states["q2"] == InstanceState.QUEUED
    active = Allocation.objects.filter(state="active", gpu_model__code="RTX4090")
    assert active.count() == 2
    held = sum(n.used_gpus for n in Node.objects.filter(gpu_model__code="RTX4090"))
    assert held == 16
    assert Notice.objects.filter(event="queued_started").count() == 2
