"""Node-health soak: hours of the embedded stack's real code, on a simulated clock, and how many
healthy nodes the console fails (issue 29; the target is none).

    .venv/bin/python bench/soak.py                      # 3 simulated hours at SIM_TIME_SCALE 0.02
    .venv/bin/python bench/soak.py --quick              # half an hour (what the test runs)

It migrates a throw-away SQLite database, loads the shipped fleet and runs, on one simulated clock:

- the beat: the reconciler (``slices.services.reconcile.reconcile``: the driver's probes, the Xid
  signals from the telemetry, the real ``check_node_health``, migrations) every 30 s, and the
  telemetry relay (``slices.telemetry.relay.Relay``: the sim driver's GPU samples, the minute
  rollups written to the database) every 10 s;
- customers on the 64 RTX 4090 hosts of ``yc-4090-1`` through the real services: orders of 1 to
  8 cards (provisioned inline by the sim driver, its steps taking ``SIM_TIME_SCALE`` × their
  realistic seconds), releases, 关机 and 开机 again (on the same or another host: new starts) and
  无卡模式 runs of 10 to 60 minutes; most hosts sit idle for long stretches and are then given an
  instance again;
- two real outages: a host under GPU instances only, later one under a 无卡模式 instance, stops
  answering (``SimDriver.silence``: no probe answer, no GPU samples). Those must be failed, and
  their instances must run again elsewhere.

The clock: simulated seconds are real seconds ÷ ``SIM_TIME_SCALE`` (at 0.02 a 45 s image pull takes
0.9 s, the 30 s beat 0.6 s); the console's ``timezone.now`` and billing's clock read it. As in the
embedded stack, the beat (the reconciler), the telemetry relay and the customers with the worker
that provisions their orders are threads on one SQLite database; a migration the reconciler starts is
provisioned inline in the beat's thread.

The baseline, in the same run: the rule before issue 29 (a node's heartbeat is its latest GPU
telemetry minute, judged silent after ``SLICES_NODE_HEARTBEAT_GRACE_SECONDS`` under a running
instance), evaluated beside the real one on the same telemetry, acting on nothing: the healthy
hosts it would have failed, by cause.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The checkout on the path and the script's own folder off it (bench/queue.py would shadow
# the standard library's queue for everything imported after).
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p).resolve() != ROOT / "bench")]

from bench.support.embedded import migrate_with_shipped_fleet, setup_embedded_django  # noqa: E402

CLUSTER = "yc-4090-1"
REGION = "yinchuan"
BEAT_S = 30  # the reconciler's beat (console/settings.py CELERY_BEAT_SCHEDULE)
TELEMETRY_S = 10  # relay ticks (the relay samples every second; every 10th is plenty here)
CUSTOMERS = 6


class SoakClock:
    """Simulated time: real seconds since the start ÷ ``scale`` (``SIM_TIME_SCALE``)."""

    def __init__(self, start: datetime, scale: float) -> None:
        if scale <= 0:
            raise ValueError("the soak needs SIM_TIME_SCALE > 0 (its clock runs at 1/scale)")
        self.start = start
        self.speed = 1.0 / scale
        self._m0 = time.monotonic()

    def seconds(self) -> float:
        return (time.monotonic() - self._m0) * self.speed

    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.seconds())

    def sleep_until(self, seconds: float) -> None:
        """Wait (in real time) until the simulated clock reads ``seconds``."""
        left = (seconds - self.seconds()) / self.speed
        if left > 0:
            time.sleep(left)


class NullLayer:
    """No browser watches the soak: the relay's live messages go nowhere."""

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        return None


@dataclass
class OldRule:
    """The rule before issue 29, judged beside the real one (it acts on nothing): a node's last
    heartbeat is its latest GPU telemetry minute (the old ``ingest_telemetry``), and a node under a
    running instance whose heartbeat is older than the grace is failed (the old
    ``check_node_health``). A node it fails stays failed: counted once."""

    grace: timedelta
    last: dict[str, datetime] = field(default_factory=dict)
    failed: dict[str, tuple[float, str]] = field(default_factory=dict)

    def beat(self, now: datetime, at_s: float) -> None:
        from django.db.models import Max

        from slices.choices import InstanceState
        from slices.models import GpuRollup, InstanceNode

        rows = (
            GpuRollup.objects.filter(
                minute__gte=now - timedelta(minutes=5), instance__state=InstanceState.RUNNING
            )
            .values("hostname")
            .annotate(latest=Max("minute"))
        )
        for row in rows:
            self.last[row["hostname"]] = min(row["latest"] + timedelta(minutes=1), now)
        held: dict[str, list[Any]] = {}
        parts = InstanceNode.objects.filter(instance__state=InstanceState.RUNNING).select_related(
            "instance"
        )
        for part in parts:
            held.setdefault(part.hostname, []).append(part.instance)
        for host, instances in held.items():
            last = self.last.get(host)
            if host in self.failed or last is None or last > now - self.grace:
                continue
            if all(i.gpuless for i in instances):
                cause = "a 无卡模式 run (no GPU samples)"
            elif any(i.running_at and i.running_at > last for i in instances):
                cause = "an idle host given a new instance (started after its last GPU sample)"
            else:  # its GPU instances ran, but no sample reached the database in the grace
                cause = "a gap in its GPU telemetry (the relay or the database slow)"
            self.failed[host] = (at_s, cause)


@dataclass
class Live:
    """One customer instance the soak drives, and what it does next."""

    pk: int
    owner: Any
    next_at: float
    plan: list[str]  # the actions still to come: "stop", "gpuless", "start", "release"


@dataclass
class Figures:
    orders: int = 0
    no_capacity: int = 0
    starts: int = 0
    gpuless_starts: int = 0
    stops: int = 0
    releases: int = 0
    idle_given_new: int = 0  # a host idle longer than the grace that an instance then ran on
    gpuless_seconds: float = 0.0
    longest_gpuless_s: float = 0.0
    max_running: int = 0
    hosts_used: set[str] = field(default_factory=set)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, default=3.0, help="simulated hours (default 3)")
    parser.add_argument(
        "--scale", type=float, default=0.02, help="SIM_TIME_SCALE (default 0.02: 50× faster)"
    )
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument(
        "--arrivals", type=float, default=0.6, help="orders per simulated minute (default 0.6)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="half a simulated hour, an order a minute (what the test runs)",
    )
    args = parser.parse_args()
    if args.quick:
        args.hours, args.arrivals = 0.5, 1.0

    work = Path(tempfile.mkdtemp(prefix="soak-"))
    try:
        return run(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path, args: argparse.Namespace) -> int:
    setup_embedded_django(
        work, SLICES_PFS_CONSOLE_ROOT=str(work / "pfs"), SLICES_SYSTEM_DISK_GB="50"
    )
    t_setup = migrate_with_shipped_fleet()

    from django.conf import settings
    from django.db import connection

    settings.SIM_TIME_SCALE = args.scale  # the sim driver reads it for each driver it makes
    from django.utils import timezone as dj_timezone

    from billing import clock as billing_clock
    from billing import services as billing
    from console.models import User
    from slices import services
    from slices.choices import InstanceState, NodeState
    from slices.drivers.sim import SimDriver
    from slices.models import Instance, InstanceNode, Node, NodeFailure
    from slices.services import power, provisioning
    from slices.services.allocation import NoCapacity
    from slices.services.reconcile import reconcile
    from slices.telemetry.relay import Relay
    from slices.telemetry.ring import MemoryRing

    rng = random.Random(args.seed)
    clock = SoakClock(datetime.now(UTC).replace(microsecond=0), args.scale)
    dj_timezone.now = clock.now  # type: ignore[assignment]  # the console's "now" is the soak's
    billing_clock.set_clock(clock)
    # A worker renews its lease five times a lease, on the simulated clock too (its thread waits
    # in real seconds).
    provisioning.heartbeat_seconds = lambda: provisioning.lease_seconds() / 5 / clock.speed
    grace = int(settings.SLICES_NODE_HEARTBEAT_GRACE_SECONDS)
    duration = args.hours * 3600

    customers = []
    for i in range(CUSTOMERS):
        user = User.objects.create_user(f"soak{i}", f"soak{i}@example.com", "x" * 20)
        billing.grant_voucher(user, Decimal("1000000"), reason="soak", valid_days=30)
        customers.append(user)
    hosts = list(Node.objects.filter(cluster__code=CLUSTER).order_by("hostname"))
    host_names = {n.hostname for n in hosts}
    idle_since: dict[str, float] = dict.fromkeys(host_names, 0.0)  # all idle at the start

    relay = Relay(MemoryRing(maxlen=120), layer=NullLayer())
    old_rule = OldRule(grace=timedelta(seconds=grace))
    figures = Figures()
    live: list[Live] = []
    gpuless_since: dict[int, float] = {}
    outages: dict[str, dict[str, Any]] = {}  # hostname -> what we silenced and why
    outage_plan = [
        (duration * 0.45, "gpu"),
        (duration * 0.65, "gpuless"),
    ]

    def held_hosts() -> dict[str, list[Instance]]:
        held: dict[str, list[Instance]] = {}
        parts = InstanceNode.objects.filter(
            instance__state=InstanceState.RUNNING, node__cluster__code=CLUSTER
        ).select_related("instance")
        for part in parts:
            held.setdefault(part.hostname, []).append(part.instance)
        return held

    def note_running(instance: Instance, at_s: float) -> None:
        for host in instance.nodes.values_list("hostname", flat=True):
            figures.hosts_used.add(host)
            since = idle_since.pop(host, None)
            if since is not None and at_s - since > grace:
                figures.idle_given_new += 1

    def note_idle(at_s: float) -> None:
        busy = set(
            InstanceNode.objects.filter(node__cluster__code=CLUSTER)
            .exclude(instance__state__in=(InstanceState.RELEASED, InstanceState.FAILED))
            .exclude(instance__state=InstanceState.STOPPED)
            .values_list("hostname", flat=True)
        )
        for host in host_names - busy:
            idle_since.setdefault(host, at_s)

    def order(at_s: float) -> None:
        owner = rng.choice(customers)
        cards = rng.choices((1, 2, 4, 8), weights=(4, 3, 2, 1))[0]
        req = services.OrderRequest(
            gpu_model="RTX4090", cards=cards, region=REGION, name=f"soak-{figures.orders}"
        )
        try:
            instance, _created = services.order_instance(owner, req)
        except NoCapacity:
            figures.no_capacity += 1
            return
        figures.orders += 1
        instance.refresh_from_db()
        if instance.state != InstanceState.RUNNING:
            return
        note_running(instance, at_s)
        life = rng.uniform(10, 80) * 60
        roll = rng.random()
        if roll < 0.35:  # stops, then a 无卡模式 run, then a normal start, then released
            plan = ["stop", "gpuless", "stop", "start", "release"]
        elif roll < 0.55:  # stops and starts again (the same host or another)
            plan = ["stop", "start", "release"]
        else:
            plan = ["release"]
        live.append(Live(instance.pk, owner, at_s + life / len(plan), plan))

    def act(item: Live, at_s: float) -> None:
        instance = Instance.objects.get(pk=item.pk)
        if not item.plan:
            live.remove(item)
            return
        action = item.plan.pop(0)
        if instance.state == InstanceState.MIGRATING:
            item.plan.insert(0, action)
            item.next_at = at_s + 120
            return
        if action == "release" or instance.state not in (
            InstanceState.RUNNING,
            InstanceState.STOPPED,
        ):
            if services.release_instance(instance, by="soak"):
                figures.releases += 1
            _end_gpuless(item.pk, at_s)
            live.remove(item)
            return
        if action == "stop" and instance.state == InstanceState.RUNNING:
            if power.stop_instance(instance, by="soak"):
                figures.stops += 1
            _end_gpuless(item.pk, at_s)
        elif action in ("start", "gpuless") and instance.state == InstanceState.STOPPED:
            mode = power.StartMode.GPULESS if action == "gpuless" else power.StartMode.AUTO
            try:
                power.start_instance(instance, by="soak", mode=mode)
            except NoCapacity:
                power.start_instance(instance, by="soak", mode=power.StartMode.GPULESS)
                action = "gpuless"
            instance.refresh_from_db()
            figures.starts += 1
            if instance.state == InstanceState.RUNNING:
                note_running(instance, at_s)
                if instance.gpuless:
                    figures.gpuless_starts += 1
                    gpuless_since[item.pk] = at_s
        span = rng.uniform(10, 60) * 60 if action == "gpuless" else rng.uniform(1, 30) * 60
        item.next_at = at_s + span
        if item.plan:
            return
        live.remove(item)

    def _end_gpuless(pk: int, at_s: float) -> None:
        since = gpuless_since.pop(pk, None)
        if since is not None:
            figures.gpuless_seconds += at_s - since
            figures.longest_gpuless_s = max(figures.longest_gpuless_s, at_s - since)

    def _on_silent_host(pk: int) -> bool:
        """The customer of an instance whose host went silent waits for the console."""
        hosts = set(InstanceNode.objects.filter(instance_id=pk).values_list("hostname", flat=True))
        return (
            bool(hosts & set(outages))
            and not Node.objects.filter(
                hostname__in=hosts & set(outages), state=NodeState.FAILED
            ).exists()
        )

    def silence(kind: str, at_s: float) -> bool:
        for host, instances in sorted(held_hosts().items()):
            if host in outages:
                continue
            gpuless = any(i.gpuless for i in instances)
            if (kind == "gpuless") == gpuless:
                SimDriver.silence(host)
                outages[host] = {
                    "kind": kind,
                    "at": at_s,
                    "instances": [i.pk for i in instances],
                }
                return True
        return False

    errors: Counter[str] = Counter()
    slowest: dict[str, float] = {}
    redriven: list[str] = []
    ended: dict[str, float] = {}
    beat_gaps: list[float] = []

    def relay_thread() -> None:
        """The embedded stack's telemetry relay thread: a tick every 10 s (it samples every second;
        every 10th is plenty here), the running instances looked up before each."""
        t = 0.0
        try:
            while t < duration:
                clock.sleep_until(t + TELEMETRY_S)
                t = clock.seconds()
                try:
                    relay.refresh()
                    relay.tick(now=clock.now().timestamp())
                except Exception as exc:  # counted and reported; the relay goes on
                    errors[f"relay: {type(exc).__name__}: {exc}"[:160]] += 1
        finally:
            ended[threading.current_thread().name] = clock.seconds()
            connection.close()

    def beat_thread() -> None:
        """Celery beat's reconciler (and the old rule beside it) every 30 s, each when the last
        one is done."""
        last_beat = -float(BEAT_S)
        try:
            while last_beat + BEAT_S < duration:
                clock.sleep_until(last_beat + BEAT_S)
                t = clock.seconds()
                now = clock.now()
                try:
                    beat_gaps.append(t - last_beat)
                    last_beat = t
                    report = reconcile(now)
                    redriven.extend(report.redriven)
                    slowest["reconciler pass"] = max(
                        slowest.get("reconciler pass", 0.0), clock.seconds() - t
                    )
                    old_rule.beat(now, t)
                    note_idle(clock.seconds())
                    figures.max_running = max(
                        figures.max_running,
                        Instance.objects.filter(state=InstanceState.RUNNING).count(),
                    )
                except Exception as exc:  # counted and reported; the beat goes on
                    errors[f"beat: {type(exc).__name__}: {exc}"[:160]] += 1
        finally:
            ended[threading.current_thread().name] = clock.seconds()
            connection.close()

    def customers_thread() -> None:
        """The customers and the worker that provisions their orders (inline, in this thread)."""
        next_order = rng.expovariate(args.arrivals / 60)
        try:
            while True:
                due = [next_order, *(i.next_at for i in live), *(at for at, _k in outage_plan)]
                t = min(due)
                if t >= duration or clock.seconds() >= duration:
                    return  # what is still due when time is up is not done
                clock.sleep_until(t)
                try:
                    while outage_plan and outage_plan[0][0] <= t:
                        at, kind = outage_plan.pop(0)
                        if not silence(kind, clock.seconds()) and at < duration * 0.85:
                            outage_plan.append((at + BEAT_S, kind))  # none to pick yet: later
                            outage_plan.sort()
                            break
                    if next_order <= t:
                        next_order += rng.expovariate(args.arrivals / 60)
                        order(clock.seconds())
                    for item in sorted(live, key=lambda i: i.next_at):
                        if item.next_at <= t and clock.seconds() < duration:
                            if _on_silent_host(item.pk):
                                item.next_at = t + BEAT_S
                            else:
                                t0 = clock.seconds()
                                act(item, t0)
                                slowest["customer action"] = max(
                                    slowest.get("customer action", 0.0), clock.seconds() - t0
                                )
                except Exception as exc:  # counted and reported; the customers go on
                    errors[f"customers: {type(exc).__name__}: {exc}"[:160]] += 1
        finally:
            ended[threading.current_thread().name] = clock.seconds()
            connection.close()

    t_real = time.perf_counter()
    threads = [
        threading.Thread(target=relay_thread, name="soak-relay"),
        threading.Thread(target=beat_thread, name="soak-beat"),
        threading.Thread(target=customers_thread, name="soak-customers"),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    simulated_s = clock.seconds()
    for pk in list(gpuless_since):
        _end_gpuless(pk, clock.seconds())
    relay.flush_rollups()
    relay.close()
    real_s = time.perf_counter() - t_real

    # -- the figures ------------------------------------------------------------------------------
    failures = list(NodeFailure.objects.select_related("node").order_by("at"))
    wrongly = [f for f in failures if f.node.hostname not in outages]
    rightly = {f.node.hostname: f for f in failures if f.node.hostname in outages}
    old_wrong = {h: v for h, v in old_rule.failed.items() if h not in outages}
    by_cause = Counter(cause for _at, cause in old_wrong.values())
    gaps = sorted(beat_gaps[1:]) or [0.0]
    print(
        f"soak: {simulated_s / 3600:.2f} simulated hours in {real_s:.0f} s real "
        f"(SIM_TIME_SCALE {args.scale:g}; set-up {t_setup:.0f} s)"
    )
    print(
        f"beat: {len(beat_gaps)} reconciler passes, scheduled every {BEAT_S} s: "
        f"{statistics.median(gaps):.0f} s median and {gaps[-1]:.0f} s at most apart on the "
        f"simulated clock (a pass's own time runs on it ×{clock.speed:g})"
    )
    print(
        "threads done at (simulated s): "
        + ", ".join(f"{name} {at:.0f}" for name, at in sorted(ended.items()))
    )
    print(
        "slowest on the simulated clock: "
        + ", ".join(f"{what} {sec:.0f} s" for what, sec in sorted(slowest.items()))
    )
    print(
        f"instances the reconciler re-drove (a lapsed worker lease): {len(redriven)}; the slowest "
        "passes are those that fail a node: eager tasks provision its migrations inline, where "
        "the embedded stack's worker threads would"
    )
    for what, n in errors.most_common():
        print(f"  error ×{n}: {what}")
    print(
        f"workload on {CLUSTER} ({len(hosts)} hosts × 8 RTX 4090): {figures.orders} orders "
        f"({figures.no_capacity} refused for capacity), {figures.starts} starts after a stop "
        f"({figures.gpuless_starts} in 无卡模式), {figures.stops} stops, {figures.releases} "
        f"releases; at most {figures.max_running} running at once; "
        f"{len(figures.hosts_used)} hosts used"
    )
    print(
        f"idle hosts given a new instance after more than {grace} s idle: {figures.idle_given_new}"
    )
    print(
        f"无卡模式 runs: {figures.gpuless_seconds / 3600:.1f} h in all, the longest "
        f"{figures.longest_gpuless_s / 60:.0f} min (no GPU samples)"
    )
    print(f"healthy hosts failed (new rule: the node's own answers): {len(wrongly)} (target 0)")
    for f in wrongly:
        print(f"  {f.node.hostname} at {f.at:%H:%M:%S}: {f.signal}: {f.detail}")
    print(
        f"healthy hosts failed (old rule: GPU samples as heartbeats, same run): {len(old_wrong)}"
        + "".join(f"\n  {n} × {cause}" for cause, n in by_cause.most_common())
    )
    ok = not wrongly
    for host, outage in outages.items():
        failure = rightly.get(host)
        moved = Instance.objects.filter(pk__in=outage["instances"])
        states = Counter(i.state for i in moved)
        if failure is None:
            ok = False
            print(f"silent host {host} ({outage['kind']} instance): NOT failed")
            continue
        took = (failure.at - clock.start).total_seconds() - outage["at"]
        stuck = [
            i
            for i in moved
            if i.state == InstanceState.MIGRATING
            or (
                i.state == InstanceState.RUNNING
                and host in set(i.nodes.values_list("hostname", flat=True))
            )
        ]
        print(
            f"silent host {host} ({outage['kind']} instance): failed {took:.0f} s after it went "
            f"silent ({failure.signal}, rule {failure.evidence.get('rule')}, "
            f"{failure.evidence.get('misses')} probes unanswered); its "
            f"{len(outage['instances'])} instance(s) now: {dict(states)}, "
            f"{len(stuck)} still on it or waiting for a node"
        )
        ok = ok and not stuck
    if len(outages) < 2:
        print("(fewer than two outages happened: run longer)")
    out_of_pool = Node.objects.filter(cluster__code=CLUSTER, state=NodeState.FAILED).count()
    print(f"hosts out of the pool at the end: {out_of_pool} (the silent ones: {len(outages)})")
    print(f"verdict: {'met' if ok else 'MISSED'}")
    SimDriver.revive()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
