"""Orders racing on PostgreSQL (SQLite ignores row locks): capacity, quota, idempotency."""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import pytest

from billing import services as billing
from billing.models import UsageSession
from billing.seed import seed_default_prices
from slices import services
from slices.models import Allocation, GpuQuota, Instance, Node
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


def _order(user, gpu_model: str, cards: int, key: str | None = None):
    try:
        return services.order_instance(
            user, services.OrderRequest(gpu_model=gpu_model, cards=cards), idempotency_key=key
        )[0]
    except services.NoCapacity as exc:
        return exc


def test_last_capacity_goes_to_exactly_as_many_orders_as_fit(world, alice, bob):
    # The small fleet's A800 cluster has room for exactly two 64-card slices.
    users = [alice, bob]
    results = race(8, lambda i: _order(users[i % 2], "A800", 64))
    won = [r for r in results if isinstance(r, Instance)]
    lost = [r for r in results if isinstance(r, services.NoCapacity)]
    assert len(won) + len(lost) == 8, results
    capacity = Node.objects.filter(gpu_model__code="A800").count() // 8
    assert len(won) == capacity
    # Losers keep nothing: no instance, no allocation, no GPU.
    assert Instance.objects.count() == capacity
    assert Allocation.objects.filter(state="active").count() == capacity
    held = sum(n.used_gpus for n in Node.objects.filter(gpu_model__code="A800"))
    assert held == 64 * capacity


def test_one_accounts_concurrent_orders_respect_its_quota(world, alice):
    GpuQuota.objects.create(team=alice.personal_team, max_gpus=8)
    results = race(6, lambda i: _order(alice, "RTX4090", 2))
    won = [r for r in results if isinstance(r, Instance)]
    refused = [r for r in results if getattr(r, "code", "") == "quota_exceeded"]
    assert len(won) == 4 and len(refused) == 2, results
    assert services.cards_in_use(alice) == 8


def test_the_same_idempotency_key_raced_creates_one_instance(world, alice):
    results = race(5, lambda i: _order(alice, "RTX4090", 1, key="same-key"))
    assert all(isinstance(r, Instance) for r in results), results
    assert len({r.pk for r in results}) == 1
    assert Instance.objects.count() == 1


def test_a_release_while_a_worker_provisions_is_torn_down_as_soon_as_the_worker_lets_go(
    world, alice, settings
):
    """The user releases while a worker holds the instance's lease mid-provisioning: the release's
    teardown finds the lease taken, and the worker, once its current step ends, stops, lets go
    and tears down itself; no waiting a lease-time for the reconciler, nothing billed."""
    settings.SIM_TIME_SCALE = 0.05  # the image start takes about two seconds
    worker = threading.Thread(target=race, args=(1, lambda i: _order(alice, "RTX4090", 1)))
    worker.start()
    deadline = time.monotonic() + 60
    instance = None
    while time.monotonic() < deadline:
        instance = Instance.objects.filter(created_by=alice).first()
        if instance is not None and instance.nodes.filter(step="mount").exists():
            break
        time.sleep(0.02)
    assert instance is not None and instance.state == "provisioning"
    assert instance.lease_until is not None  # the worker is starting the image

    assert services.release_instance(instance, by="alice")
    instance.refresh_from_db()
    assert instance.state == "releasing"  # its teardown found the lease taken
    worker.join(timeout=60)
    assert not worker.is_alive()

    instance.refresh_from_db()
    assert instance.state == "released", list(instance.events.values_list("code", flat=True))
    assert instance.resources_freed_at is not None
    assert not instance.events.filter(code="redriven").exists()  # not the reconciler
    assert Allocation.objects.filter(state="active").count() == 0
    assert not UsageSession.objects.filter(resource_id=str(instance.public_id)).exists()
