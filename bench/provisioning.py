"""Provisioning benchmark: order → running, through the real services, with both node drivers.

    .venv/bin/python bench/provisioning.py            # the full run
    .venv/bin/python bench/provisioning.py --quick    # a reduced run (what the test runs)

It migrates a throw-away SQLite database file, loads the shipped fleet (6,080 GPUs), funds one
customer and orders through ``slices.services.order_instance``: the order commits, the
provisioning task runs inline (Celery eager), drives every node through the driver and marks the
instance running; the call returns then, so its wall time is order → running. Each instance is
released afterwards (not timed).

1. Control-plane overhead: a 128-card A800 slice (16 nodes) with the ``sim``
   driver at ``SIM_TIME_SCALE=0`` (every simulated step instant): ordering, quota and funds
   checks, allocation on the fat tree, 16 nodes × 5 steps recorded as events, the all-reduce
   figures, billing start. --reps repetitions; median against the target (≤ 2 s).
2. Parallel speed-up of the ``ssh`` driver on real sshd test hosts (tests/support/sshd.py: Debian's
   OpenSSH, one process per host on a loopback port, its own host key and node directory): a
   64-card A800 slice on 8 nodes pointed at 8 hosts vs an 8-card host on 1 node on 1 host,
   --ssh-reps each (after a warm-up order each); medians and their ratio against the target
   (8 hosts ≤ 1.5 × one host). The other A800 nodes are put in maintenance so the allocator uses
   the 8 that point at the test hosts. All hosts share this machine's cores, unlike real nodes:
   the ratio here is an upper bound of what separate machines would show.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support.embedded import migrate_with_shipped_fleet, setup_embedded_django  # noqa: E402

SIM_TARGET_S = 2.0
SSH_RATIO_TARGET = 1.5
SLICE_NODES = 8  # the smallest slice: 64 cards


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="sim-driver orders (default 5)")
    parser.add_argument("--ssh-reps", type=int, default=3, help="ssh orders of each size")
    parser.add_argument(
        "--hosts", type=int, default=8, help="ssh test hosts under the 8-node slice (default 8)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a reduced run: 1 sim order; 8 nodes on 2 hosts, 1 rep"
    )
    args = parser.parse_args()
    if args.quick:
        args.reps, args.ssh_reps, args.hosts = 1, 1, 2

    work = Path(tempfile.mkdtemp(prefix="bench-provisioning-"))
    # A self-contained embedded setup: its own SQLite file, no Redis, tasks run inline.
    setup_embedded_django(work)
    try:
        took = migrate_with_shipped_fleet()
        print(
            f"set-up: migrated {work / 'bench.sqlite3'}, loaded the shipped fleet "
            f"({took:.1f} s, not measured)"
        )
        user = _customer()
        sim_ok = bench_sim(user, args.reps)
        ssh_ok = bench_ssh(user, work, args.hosts, args.ssh_reps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.quick:
        return 0  # a smoke run on whatever machine runs the tests: figures, no verdict
    return 0 if sim_ok and ssh_ok else 1


def _customer():  # noqa: ANN202
    from billing import services as billing
    from console.models import User

    user = User.objects.create_user(username="bench", email="bench@example.com", password="x" * 16)
    billing.grant_voucher(user, Decimal("100000"), reason="bench", valid_days=30)
    return user


def _order(user, gpu_model: str, cards: int) -> tuple[float, object]:  # noqa: ANN001
    from slices import services

    started = time.perf_counter()
    instance, _created = services.order_instance(
        user, services.OrderRequest(gpu_model=gpu_model, cards=cards)
    )
    elapsed = time.perf_counter() - started
    instance.refresh_from_db()
    if instance.state != "running":
        events = list(instance.events.order_by("pk").values_list("code", "node", "text"))[-8:]
        raise SystemExit(f"{instance.slug} ended {instance.state}: {events}")
    return elapsed, instance


def _release(instance) -> None:  # noqa: ANN001
    from slices import services

    services.release_instance(instance, by="bench")
    instance.refresh_from_db()
    if instance.state != "released":
        raise SystemExit(f"{instance.slug} did not release: {instance.state}")


def _figures(samples: list[float]) -> str:
    return (
        f"median {statistics.median(samples):.3f} s  (min {min(samples):.3f}, "
        f"max {max(samples):.3f}, n={len(samples)})"
    )


def bench_sim(user, reps: int) -> bool:  # noqa: ANN001
    from django.conf import settings

    settings.SLICES_DRIVER = "sim"
    settings.SIM_TIME_SCALE = 0
    print("\n1. Control plane: order → running, 128-card A800 slice, sim driver, SIM_TIME_SCALE=0")
    samples = []
    for _ in range(reps):
        elapsed, instance = _order(user, "A800", 128)
        nodes = instance.nodes.count()
        samples.append(elapsed)
        _release(instance)
    median = statistics.median(samples)
    ok = median <= SIM_TARGET_S
    print(f"   {nodes} nodes: {_figures(samples)}")
    print(f"   target ≤ {SIM_TARGET_S:.1f} s: {'met' if ok else 'MISSED'}")
    return ok


def bench_ssh(user, work: Path, hosts_wanted: int, reps: int) -> bool:  # noqa: ANN001
    from django.conf import settings

    from slices.choices import NodeState
    from slices.models import Node
    from tests.support.sshd import SshHostPool, configure_ssh_fleet, sshd_available

    print(
        f"\n2. ssh driver on real sshd test hosts: a 64-card slice, {SLICE_NODES} nodes on "
        f"{hosts_wanted} hosts, vs an 8-card host, 1 node on 1 host (order → running)"
    )
    if not sshd_available():
        print("   not run: needs /usr/sbin/sshd (openssh-server) and root")
        return False
    # The first 8 nodes of one A800 scalable unit take the slice; the others are in maintenance.
    a800 = Node.objects.filter(gpu_model__code="A800").order_by("cluster", "su__index", "index")
    first = a800.first()
    assert first is not None
    chosen = list(a800.filter(su=first.su)[:SLICE_NODES])
    Node.objects.filter(gpu_model__code="A800").exclude(pk__in=[n.pk for n in chosen]).update(
        state=NodeState.MAINTENANCE
    )
    pool = SshHostPool(work / "sshd")
    try:
        started = time.perf_counter()
        hosts = pool.get(hosts_wanted)
        print(f"   started {len(hosts)} sshd test hosts in {time.perf_counter() - started:.2f} s")
        # Round robin: with fewer hosts than nodes, nodes share a host (each its own workdir).
        configure_ssh_fleet(settings, hosts, chosen, work / "fleet", client_key=pool.client_key)
        settings.SLICES_SSH_CONNECT_TIMEOUT = 10.0
        cards = 8 * SLICE_NODES
        results: dict[int, list[float]] = {8: [], cards: []}
        for size in (8, cards):
            _release(_order(user, "A800", size)[1])  # warm-up (imports, first connections)
            for _ in range(reps):
                elapsed, instance = _order(user, "A800", size)
                assert instance.nodes.count() == size // 8
                results[size].append(elapsed)
                _release(instance)
    finally:
        pool.stop()
    one = statistics.median(results[8])
    many = statistics.median(results[cards])
    ratio = many / one
    ok = ratio <= SSH_RATIO_TARGET
    print(f"   1 node on 1 host:       {_figures(results[8])}")
    print(f"   {SLICE_NODES} nodes on {hosts_wanted} hosts:     {_figures(results[cards])}")
    print(
        f"   ratio {ratio:.2f} × one host (one node after another would be ~{SLICE_NODES}×); "
        f"target ≤ {SSH_RATIO_TARGET} ×: {'met' if ok else 'MISSED'}"
    )
    print(f"   (all hosts share this machine's {os.cpu_count()} CPU cores)")
    return ok


if __name__ == "__main__":
    sys.exit(main())
