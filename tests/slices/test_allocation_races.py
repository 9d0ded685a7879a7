"""Many orders racing for the last capacity, on PostgreSQL (SQLite ignores row locks)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from slices import services
from slices.models import GPU, Allocation, AllocationNode, Node
from tests.slices.factories import load_small_fleet

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _race(users: list, requests: list[tuple[int, str]]) -> tuple[list, list]:
    barrier = threading.Barrier(len(requests))

    def one(i: int) -> object:
        gpus, model = requests[i]
        try:
            barrier.wait()
            return services.allocate(users[i % len(users)], gpus, model)
        except services.NoCapacity as exc:
            return exc
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        results = list(pool.map(one, range(len(requests))))
    won = [r for r in results if isinstance(r, Allocation)]
    lost = [r for r in results if isinstance(r, services.NoCapacity)]
    assert len(won) + len(lost) == len(requests), results
    return won, lost


def _assert_no_double_booking() -> None:
    parts = list(AllocationNode.objects.values_list("node_id", "gpu_mask"))
    seen: dict[int, int] = {}
    for node_id, mask in parts:
        assert seen.get(node_id, 0) & mask == 0, f"GPU on node {node_id} booked twice"
        seen[node_id] = seen.get(node_id, 0) | mask
    for node in Node.objects.all():
        assert node.free_mask == node.full_mask & ~seen.get(node.pk, 0)
    assert GPU.objects.filter(allocation__isnull=False).count() == sum(
        bin(m).count("1") for m in seen.values()
    )


def test_parallel_slices_for_the_last_capacity_exactly_as_many_win_as_fit(alice, bob) -> None:
    load_small_fleet()  # H800: 3 SUs of 8 nodes = room for exactly three 64-GPU slices
    won, lost = _race([alice, bob], [(64, "H800")] * 12)
    assert len(won) == 3 and len(lost) == 9
    assert all(a.su_count == 1 for a in won)
    _assert_no_double_booking()
    for exc in lost:
        assert exc.code == "no_capacity"
        assert any(alt["gpu_model"] == "A800" for alt in exc.alternatives), exc.as_body()


def test_parallel_hosts_share_nodes_without_double_booking(alice, bob) -> None:
    load_small_fleet()  # RTX 4090: 2 nodes × 8 GPUs = 16 GPUs
    won, lost = _race([alice, bob], [(2, "RTX4090")] * 6 + [(4, "RTX4090")] * 6)
    assert sum(a.gpu_count for a in won) == 16  # capacity is used to the last GPU
    assert len(lost) == 12 - len(won) and lost
    _assert_no_double_booking()
    for a in won:
        services.release_allocation(a)
    assert set(Node.objects.values_list("free_mask", flat=True)) == {255}
