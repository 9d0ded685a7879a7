"""Disk races on PostgreSQL (SQLite ignores row locks): the per-account limit, one attachment
per instance, delete against attach, and exactly one open storage session."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.http import Http404

from billing import services as billing
from billing.models import UsageSession
from billing.seed import seed_default_prices
from console.errors import DomainError
from slices.models import Disk, DiskAttachment
from slices.services import disks
from tests.slices.factories import load_small_fleet, make_instance

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _race(calls: list[Callable[[], Any]]) -> list[Any]:
    barrier = threading.Barrier(len(calls))

    def one(i: int) -> Any:
        try:
            barrier.wait()
            return calls[i]()
        except (DomainError, Http404) as exc:
            return exc
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(one, range(len(calls))))


@pytest.fixture
def funded(alice):
    seed_default_prices()  # a transactional test starts from an empty database
    load_small_fleet()
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    return alice


def test_parallel_creates_respect_the_limit_and_bill_one_session(funded, settings) -> None:
    settings.SLICES_DISK_MAX_PER_ACCOUNT = 3
    free = billing.current_price_book().storage_free_gb
    results = _race(
        [
            (lambda i=i: disks.create_disk(funded, name=f"d{i}", size_gb=free, region="xiamen"))
            for i in range(8)
        ]
    )
    made = [r for r in results if isinstance(r, Disk)]
    assert len(made) == 3, results
    assert all(r.code == "quota_exceeded" for r in results if not isinstance(r, Disk))
    sessions = UsageSession.objects.filter(resource_kind="storage", state="open")
    assert sessions.count() == 1
    assert sessions.get().cards == 3 * free - free  # the free GB counted once per account


def test_one_attachment_per_instance_under_concurrency(funded) -> None:
    disk = disks.create_disk(funded, name="d", size_gb=10, region="xiamen")
    inst = make_instance(funded, region=disk.region)
    results = _race([lambda: disks.attach_disk(disk, inst, "rw")] * 6)
    assert len([r for r in results if isinstance(r, DiskAttachment)]) == 1
    assert DiskAttachment.objects.filter(disk=disk, detached_at__isnull=True).count() == 1


def test_delete_against_attach_never_leaves_a_deleted_disk_attached(funded) -> None:
    for _round in range(5):
        disk = disks.create_disk(funded, name="d", size_gb=10, region="xiamen")
        inst = make_instance(funded, region=disk.region)
        _race(
            [
                lambda d=disk: disks.delete_disk(d),
                lambda d=disk, i=inst: disks.attach_disk(d, i, "ro"),
            ]
        )
        disk.refresh_from_db()
        attached = DiskAttachment.objects.filter(disk=disk, detached_at__isnull=True).exists()
        assert not (disk.state == "deleted" and attached)
        assert disk.state == "deleted" or attached
