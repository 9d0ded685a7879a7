"""The pages' shared view of the fleet on PostgreSQL: the behaviour of test_fleet_cache.py again,
and readers racing claims from many connections never leave a stale view shared."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from slices import services
from slices.models import Node
from slices.services.fleet import availability
from tests.slices.test_fleet_cache import *  # noqa: F403  # the same tests, on PostgreSQL here
from tests.slices.test_fleet_cache import _free

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_readers_racing_claims_end_on_the_fleet_as_it_is(fleet, alice, bob) -> None:  # noqa: F811
    stop = threading.Event()
    seen: list[int] = []

    def read() -> None:
        try:
            while not stop.is_set():
                seen.append(_free("H800"))
        finally:
            connection.close()

    def claim(i: int) -> object:
        try:
            return services.allocate((alice, bob)[i % 2], 64, "H800")
        except services.NoCapacity as exc:
            return exc
        finally:
            connection.close()

    readers = [threading.Thread(target=read) for _ in range(3)]
    for reader in readers:
        reader.start()
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(claim, range(8)))
    stop.set()
    for reader in readers:
        reader.join()
    assert sum(not isinstance(r, services.NoCapacity) for r in results) == 3
    assert seen and all(free in (192, 128, 64, 0) for free in seen)
    # Whatever the readers built while the claims committed, what is shared now is the fleet.
    free_in_rows = sum(
        bin(mask).count("1")
        for mask in Node.objects.filter(gpu_model__code="H800").values_list("free_mask", flat=True)
    )
    assert free_in_rows == 0
    assert [a.free_gpus for a in availability() if a.gpu_model == "H800"] == [0]
