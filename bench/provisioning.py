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
   --ssh-reps each, the two sizes in turn (after a warm-up order each); medians and their ratio
   against the target (8 hosts ≤ 1.5 × one host). The other A800 nodes are put in maintenance so
   the allocator uses the 8 that point at the test hosts. All hosts share this machine's cores,
   unlike real nodes: the ratio here is an upper bound of what separate machines would show.
   Printed with it: the CPU seconds each order cost (this process's recording thread, its SSH
   client threads, the test hosts' sshd and commands, per host) and the shortest time that CPU
   allows on this machine's cores; where each order's time goes (before the drive, to the first
   node step, the node steps, after them); per step, each node's working time (the driver's call)
   and waiting time (for the one thread that records every step, and the thread pool); and what
   that recording thread was busy with meanwhile.
3. The ETA's first estimate (what the instance page and the API's ``eta_seconds`` say right after
   the order) against the real time from the order to running, over --eta-orders simulated orders
   spread evenly over the size buckets (A800: 1 card, 2/4 cards, 8 cards on one node; 64-, 128-
   and 256-card slices on 8, 16 and 32 nodes) in a shuffled order, at ``SIM_TIME_SCALE`` 0.02,
   after a warm-up of 3 orders of each size that gives the history something to learn from. The
   history also holds part 1's orders (at ``SIM_TIME_SCALE=0``, when run): steps that took
   another time, as after a driver change. Both estimates in the same run: the learnt one (recent
   comparable orders' timelines) and the driver's step model alone (the baseline), unrounded (the
   page rounds to whole seconds, which at this time scale would be most of the error). Target:
   median absolute error ≤ 10 % in every size bucket.
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
# The checkout on the path and the script's own folder off it (bench/queue.py would shadow
# the standard library's queue for everything imported after).
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p).resolve() != ROOT / "bench")]

from bench.support.embedded import migrate_with_shipped_fleet, setup_embedded_django  # noqa: E402

SIM_TARGET_S = 2.0
SSH_RATIO_TARGET = 1.5
SLICE_NODES = 8  # the smallest slice: 64 cards
ETA_TARGET = 0.10
ETA_SIZES = (1, 2, 4, 8, 64, 128, 256)
ETA_BUCKETS = {1: "1", 2: "2/4", 4: "2/4", 8: "8", 64: "64", 128: "128", 256: "256"}  # cards


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="sim-driver orders (default 5)")
    parser.add_argument("--ssh-reps", type=int, default=5, help="ssh orders of each size")
    parser.add_argument(
        "--hosts", type=int, default=8, help="ssh test hosts under the 8-node slice (default 8)"
    )
    parser.add_argument(
        "--eta-orders",
        type=int,
        default=36,
        help="orders whose first ETA is scored, spread over the size buckets (default 36)",
    )
    parser.add_argument(
        "--parts",
        default="sim,eta,ssh",
        help="which parts to run, comma-separated (default: sim,eta,ssh)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a reduced run: 1 sim order; 8 nodes on 2 hosts, 1 rep; 6 ETA orders",
    )
    args = parser.parse_args()
    if args.quick:
        args.reps, args.ssh_reps, args.hosts, args.eta_orders = 1, 1, 2, 6

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
        parts = set(args.parts.split(","))
        sim_ok = "sim" not in parts or bench_sim(user, args.reps)
        eta_ok = "eta" not in parts or bench_eta(
            user, args.eta_orders, warm_up=1 if args.quick else 3
        )
        ssh_ok = "ssh" not in parts or bench_ssh(user, work, args.hosts, args.ssh_reps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.quick:
        return 0  # a smoke run on whatever machine runs the tests: figures, no verdict
    return 0 if sim_ok and ssh_ok and eta_ok else 1


def _customer():  # noqa: ANN202
    from billing import services as billing
    from console.models import User
    from console.verification import services as verification

    user = User.objects.create_user(username="bench", email="bench@example.com", password="x" * 16)
    billing.grant_voucher(user, Decimal("100000"), reason="bench", valid_days=30)
    # 实名认证 through the sandbox provider: slices of 64 cards or more need it.
    verification.submit_personal(user, real_name="Bench", id_number="11010519491231002X")
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


def eta_schedule(orders: int, seed: int = 7) -> list[int]:
    """``orders`` sizes spread evenly over the buckets (sizes of one bucket in turn), shuffled."""
    import random

    buckets: dict[str, list[int]] = {}
    for size in ETA_SIZES:
        buckets.setdefault(ETA_BUCKETS[size], []).append(size)
    names = list(buckets)
    sizes = []
    for i in range(orders):
        group = buckets[names[i % len(names)]]
        sizes.append(group[(i // len(names)) % len(group)])
    random.Random(seed).shuffle(sizes)
    return sizes


def bench_eta(user, orders: int, warm_up: int) -> bool:  # noqa: ANN001
    from django.conf import settings
    from django.core.cache import cache

    from slices import eta
    from slices.models import GpuModel
    from slices.services import eta as eta_service

    settings.SLICES_DRIVER = "sim"
    settings.SIM_TIME_SCALE = 0.02
    a800 = GpuModel.objects.get(code="A800")
    print(
        f"\n3. The first ETA vs the real order → running: {orders} sim orders over the size "
        f"buckets ({', '.join(dict.fromkeys(ETA_BUCKETS.values()))} A800 cards), "
        f"SIM_TIME_SCALE=0.02, after {warm_up} warm-up order(s) of each size"
    )
    for size in ETA_SIZES:
        for _ in range(warm_up):
            _release(_order(user, "A800", size)[1])
    # bucket -> [(real, learnt error, step-model error, every-regime error)]
    scored: dict[str, list[tuple[float, float, float, float]]] = {}
    for size in eta_schedule(orders):
        nodes, is_slice = max(1, size // 8), size > 8
        cache.clear()  # every order before this one counts (the page's cache lasts 30 s)
        learnt = eta_service.first_estimate("sim", a800.pk, nodes, slice_=is_slice)
        model = eta_service._model_seconds("sim", [], nodes, is_slice)
        before = eta.estimate(  # the same history, every regime counted (before issue 32)
            eta_service.history("sim", a800.pk),
            nodes=nodes,
            milestone=eta.ORDERED,
            since_s=0.0,
            fallback_s=model,
            regime=False,
        )
        _elapsed, instance = _order(user, "A800", size)
        actual = (instance.running_at - instance.created_at).total_seconds()
        scored.setdefault(ETA_BUCKETS[size], []).append(
            (
                actual,
                eta.absolute_error(learnt.exact, actual),
                eta.absolute_error(model, actual),
                eta.absolute_error(before.exact, actual),
            )
        )
        print(
            f"   {size:>4} cards: real {actual:6.2f} s · learnt {learnt.exact:6.2f} s "
            f"({learnt.source}, {learnt.samples} orders) · every regime {before.exact:6.2f} s · "
            f"step model {model:6.2f} s"
        )
        _release(instance)
    return _eta_report(scored)


def _eta_report(scored: dict[str, list[tuple[float, float, float, float]]]) -> bool:
    """Per size bucket and over all: the median absolute error of the learnt estimate, of the
    same history with every regime counted (as before issue 32) and of the step model alone;
    the target holds in every bucket."""
    print(
        "   median absolute error per size bucket: learnt (max) vs every regime counted (max) vs "
        "the step model alone (max)"
    )
    ok = True
    rows = [(f"{b} cards", v) for b, v in scored.items()]
    rows.sort(key=lambda r: int(r[0].split()[0].split("/")[0]))
    rows.append(("all", [x for v in scored.values() for x in v]))
    for label, values in rows:
        learnt = [v[1] for v in values]
        model = [v[2] for v in values]
        before = [v[3] for v in values]
        met = statistics.median(learnt) <= ETA_TARGET
        if label != "all":
            ok = ok and met
        print(
            f"   {label:>10}: n={len(values):<3} real median {statistics.median(v[0] for v in values):5.2f} s"
            f" · learnt {statistics.median(learnt):6.1%} (max {max(learnt):6.1%})"
            f" · every regime {statistics.median(before):6.1%} (max {max(before):6.1%})"
            f" · step model {statistics.median(model):6.1%} (max {max(model):6.1%})"
            + ("" if label == "all" else f" · {'met' if met else 'MISSED'}")
        )
    print(f"   target ≤ {ETA_TARGET:.0%} in every bucket: {'met' if ok else 'MISSED'}")
    return ok


class _SshTrace:
    """What an ssh order spends its time and CPU on, from outside the code it measures: the
    driver's step calls are wrapped (each node's working time), and so are the functions of
    ``slices.services.provisioning`` that the drive's one recording thread runs (each step's
    record, the log lines, the release check, the all-reduce check, running and billing), so a
    node's time splits into working and waiting for that thread. CPU: this process's (the
    recording thread and, apart, the SSH client's threads: paramiko's transports and the step
    threads) and the test hosts' (``_HostCpu``)."""

    STEPS = ("connect", "prepare", "mount", "start", "health")
    RECORDER = (
        "_record_step",
        "record_logs",
        "_still_provisioning",
        "_record_published_ports",
        "_allreduce",
        "mark_running",
    )

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.steps: list[tuple[str, str, float, float]] = []  # node, step, start, end
        self.recorder: list[tuple[str, str, str, float, float]] = []  # what, node, step, start, end
        self.drive: tuple[float, float] | None = None
        self.undo: list[tuple[object, str, object]] = []

    def install(self) -> None:
        from slices.drivers.ssh import SshDriver
        from slices.services import provisioning

        def driver_step(name: str, orig):  # noqa: ANN001, ANN202
            def traced(driver, spec, node, log):  # noqa: ANN001, ANN202
                t0 = time.perf_counter()
                try:
                    return orig(driver, spec, node, log)
                finally:
                    with self.lock:
                        self.steps.append((node.hostname, name, t0, time.perf_counter()))

            return traced

        def recorder(name: str, orig):  # noqa: ANN001, ANN202
            def traced(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                t0 = time.perf_counter()
                try:
                    return orig(*args, **kwargs)
                finally:
                    node = step = ""
                    if name == "_record_step":
                        node, step = args[1].target.hostname, str(args[2])
                    self.recorder.append((name, node, step, t0, time.perf_counter()))

            return traced

        def drive(orig):  # noqa: ANN001, ANN202
            def traced(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                t0 = time.perf_counter()
                try:
                    return orig(*args, **kwargs)
                finally:
                    self.drive = (t0, time.perf_counter())

            return traced

        for name in self.STEPS:
            self._patch(SshDriver, name, driver_step(name, getattr(SshDriver, name)))
        for name in self.RECORDER:
            self._patch(provisioning, name, recorder(name, getattr(provisioning, name)))
        self._patch(provisioning, "provision_instance", drive(provisioning.provision_instance))

    def _patch(self, owner: object, name: str, value: object) -> None:
        self.undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def uninstall(self) -> None:
        for owner, name, value in reversed(self.undo):
            setattr(owner, name, value)
        self.undo.clear()

    def clear(self) -> None:
        self.steps.clear()
        self.recorder.clear()
        self.drive = None

    def split(self, started: float, elapsed: float) -> dict:
        """One order's timeline (ms): before the drive, to the first node step, the node steps
        (to the slowest node's last), after them; per step, working and waiting (from the node's
        previous step's end, or the first node's start, to this step's start: the recording
        thread, then the pool); and the recording thread's busy time by what it did."""
        assert self.drive is not None
        d0, d1 = self.drive
        first = min(s[2] for s in self.steps)
        last = max(s[3] for s in self.steps)
        by_node: dict[str, list[tuple[str, str, float, float]]] = {}
        for step in sorted(self.steps, key=lambda s: s[2]):
            by_node.setdefault(step[0], []).append(step)
        work: dict[str, list[float]] = {name: [] for name in self.STEPS}
        wait: dict[str, list[float]] = {name: [] for name in self.STEPS}
        nodes = {}
        for host, steps in by_node.items():
            before = first
            for _host, name, t0, t1 in steps:
                work[name].append((t1 - t0) * 1000)
                wait[name].append((t0 - before) * 1000)
                before = t1
            nodes[host] = {
                "start": (steps[0][2] - first) * 1000,
                "work": sum((t1 - t0) for *_x, t0, t1 in steps) * 1000,
                "end": (steps[-1][3] - first) * 1000,
            }
        busy: dict[str, float] = {}
        for name, _node, _step, t0, t1 in self.recorder:
            if first <= t0 <= last:
                busy[name] = busy.get(name, 0.0) + (t1 - t0) * 1000
        return {
            "before": (d0 - started) * 1000,
            "setup": (first - d0) * 1000,
            "nodes": (last - first) * 1000,
            "after": (d1 - last) * 1000,
            "rest": (started + elapsed - d1) * 1000,
            "work": {k: statistics.mean(v) for k, v in work.items() if v},
            "wait": {k: statistics.mean(v) for k, v in wait.items() if v},
            "node_rows": nodes,
            "busy": busy,
        }


class _HostCpu:
    """CPU seconds the test hosts spent: each sshd's reaped children (the sessions and every
    command they ran: counted once a session has ended) and the processes an order left running
    (the instance's own sshd, its workload: what they used so far)."""

    def __init__(self, hosts, fleet: Path) -> None:  # noqa: ANN001
        self.masters = [h.process.pid for h in hosts]
        self.fleet = fleet

    @staticmethod
    def _stat(pid: int) -> list[int]:
        return [
            int(x) for x in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:15]
        ]

    def _sessions_open(self) -> bool:
        for pid in self.masters:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children:
                return True
        return False

    def snapshot(self, settle: float = 3.0) -> tuple[float, dict[int, float]]:
        """(the sshds' reaped children, {pid: CPU} of the processes under the fleet)."""
        from tests.support.sshd import processes_under

        deadline = time.monotonic() + settle
        while self._sessions_open() and time.monotonic() < deadline:
            time.sleep(0.05)
        tick = os.sysconf("SC_CLK_TCK")
        reaped = sum(sum(self._stat(pid)[2:4]) for pid in self.masters) / tick
        live = {}
        for pid in processes_under(self.fleet):
            if pid in self.masters:
                continue
            try:
                live[pid] = sum(self._stat(pid)[0:2]) / tick
            except FileNotFoundError:
                continue
        return reaped, live

    @staticmethod
    def spent(
        before: tuple[float, dict[int, float]], after: tuple[float, dict[int, float]]
    ) -> float:
        reaped = after[0] - before[0]
        live = sum(cpu - before[1].get(pid, 0.0) for pid, cpu in after[1].items())
        return reaped + live


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
    trace = _SshTrace()
    cards = 8 * SLICE_NODES
    results: dict[int, list[float]] = {8: [], cards: []}
    runs: dict[int, list[dict]] = {8: [], cards: []}
    try:
        started = time.perf_counter()
        hosts = pool.get(hosts_wanted)
        print(f"   started {len(hosts)} sshd test hosts in {time.perf_counter() - started:.2f} s")
        # Round robin: with fewer hosts than nodes, nodes share a host (each its own workdir).
        configure_ssh_fleet(settings, hosts, chosen, work / "fleet", client_key=pool.client_key)
        settings.SLICES_SSH_CONNECT_TIMEOUT = 10.0
        host_cpu = _HostCpu(hosts, work / "fleet")
        trace.install()
        for size in (8, cards):
            _release(_order(user, "A800", size)[1])  # warm-up (imports, first connections)
        # One order of each size in turn: both see the same load from whatever else runs here.
        for _ in range(reps):
            for size in (8, cards):
                hosts_before = host_cpu.snapshot()
                trace.clear()
                load = os.getloadavg()[0]
                cpu0, main0, t0 = os.times(), time.thread_time(), time.perf_counter()
                elapsed, instance = _order(user, "A800", size)
                main, cpu1 = time.thread_time() - main0, os.times()
                console = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
                hosts_cpu = _HostCpu.spent(hosts_before, host_cpu.snapshot())
                assert instance.nodes.count() == size // 8
                results[size].append(elapsed)
                runs[size].append(
                    {
                        "wall": elapsed,
                        "load": load,
                        "main": main,
                        "threads": max(0.0, console - main),
                        "hosts": hosts_cpu,
                        "split": trace.split(t0, elapsed),
                    }
                )
                _release(instance)
    finally:
        trace.uninstall()
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
    _print_ssh_split(runs, cards, hosts_wanted, one)
    return ok


def _median_run(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["wall"])[len(runs) // 2]


def _print_ssh_split(runs: dict[int, list[dict]], cards: int, hosts: int, one: float) -> None:
    cores = os.cpu_count() or 1
    print(
        "\n   CPU per order (median of each), CPU seconds: this process's recording thread (the "
        "database), its SSH client threads (paramiko, the step threads), the test hosts (sshd, "
        "its sessions and the commands they ran)"
    )
    figures = {}
    for size, label in ((8, "1 node "), (cards, f"{SLICE_NODES} nodes")):
        main = statistics.median(r["main"] for r in runs[size])
        threads = statistics.median(r["threads"] for r in runs[size])
        host = statistics.median(r["hosts"] for r in runs[size])
        total = main + threads + host
        wall = statistics.median(r["wall"] for r in runs[size])
        figures[size] = (total, main + threads, wall)
        per_host = host / min(size // 8, hosts)
        print(
            f"   {label}: recording {main:.2f} + ssh client {threads:.2f} + test hosts {host:.2f} "
            f"({per_host:.3f} a host) = {total:.2f} CPU-s in {wall:.2f} s: {total / wall:.2f} of "
            f"{cores} cores on average (load average at the start "
            f"{statistics.median(r['load'] for r in runs[size]):.1f})"
        )
    total, console, wall = figures[cards]
    print(
        f"   the {SLICE_NODES}-node order needs {total / figures[8][0]:.1f} × the 1-node order's "
        f"CPU: with every core free it could not take less than {total / cores:.2f} s "
        f"({total / cores / one:.2f} × the 1-node median measured here); with the test hosts' "
        f"share on machines of their own, as real nodes' is, this process's alone "
        f"{console / cores:.2f} s ({console / cores / one:.2f} ×)"
    )
    for size in (8, cards):
        run = _median_run(runs[size])
        s = run["split"]
        print(
            f"\n   where the time goes, {size // 8} node(s), the median run ({run['wall']:.3f} s), "
            f"ms: before the drive (order, quota, allocation) {s['before']:.0f} · drive set-up to "
            f"the first node step {s['setup']:.0f} · node steps to the slowest node's last "
            f"{s['nodes']:.0f} · after (all-reduce check, running, billing) {s['after']:.0f} · "
            f"the rest {s['rest']:.0f}"
        )
        cells = "  ".join(
            f"{name} {s['work'][name]:.0f}/{s['wait'].get(name, 0):.0f}" for name in s["work"]
        )
        print(f"     per step, mean over the nodes, working/waiting: {cells}")
        rows = sorted(s["node_rows"].items(), key=lambda kv: kv[1]["end"])
        starts = ", ".join(f"{r['start']:.0f}" for _h, r in rows)
        works = ", ".join(f"{r['work']:.0f}" for _h, r in rows)
        print(f"     each node (by its end): first step started at +[{starts}], working [{works}]")
        busy = ", ".join(f"{k.lstrip('_')} {v:.0f}" for k, v in sorted(s["busy"].items()))
        print(f"     the recording thread during the node steps, busy ms: {busy}")


if __name__ == "__main__":
    sys.exit(main())
