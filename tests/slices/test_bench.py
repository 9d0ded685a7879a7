"""The allocator benchmark's pieces: trace format, seeded generator, one small replay."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.allocation.baselines import POLICIES
from bench.allocation.metrics import placeable_gpus, stranded_gpus
from slices.fleetfile import parse_fleet
from slices.topology import Fleet, Placement, Request
from tests.slices.factories import SMALL_FLEET
from tests.slices.test_topology import make_spec

SIZES = (1, 2, 4, 8, 8, 64, 128, 192)
BENCH = Path(__file__).resolve().parents[2] / "bench" / "allocator.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_allocator", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_synthetic_trace_is_seeded_and_round_trips_through_jsonl(tmp_path: Path) -> None:
    bench = _bench()
    fleet = parse_fleet(SMALL_FLEET)
    trace = bench.synthetic_trace(fleet, 0.9, 200, seed=7)
    assert trace == bench.synthetic_trace(fleet, 0.9, 200, seed=7)
    assert trace != bench.synthetic_trace(fleet, 0.9, 200, seed=8)
    path = tmp_path / "trace.jsonl"
    bench.write_trace(trace, path)
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"t", "id", "gpus", "gpu_model", "duration"}
    assert bench.read_trace(path) == trace


def test_replay_reports_every_metric_and_ours_stays_at_the_state_minimum() -> None:
    bench = _bench()
    fleet = parse_fleet(SMALL_FLEET)
    trace = bench.synthetic_trace(fleet, 1.0, 300, seed=3)
    for discipline in ("fifo-backfill", "loss"):
        result = bench.Simulation(fleet, "ours", discipline, 3600.0).run(trace, 600.0)
        assert result["requests"] == len(trace)
        assert 0 < result["acceptance_ratio"] <= 1
        assert result["slices_at_state_min"] == 1.0
        for key in ("fragmentation_mean", "stranded_gpus_mean", "wait_by_size", "alloc_latency_us"):
            assert key in result
    baseline = bench.Simulation(fleet, "first-fit", "loss", 3600.0).run(trace, 600.0)
    assert baseline["policy"] == "first-fit"


def test_every_policy_places_without_double_booking_and_release_restores_the_fleet() -> None:
    rng = random.Random(5)
    for name, policy in POLICIES.items():
        fleet = Fleet(make_spec([20, 20, 16], clusters=2))
        taken: dict[tuple[str, int], str] = {}
        live: list[str] = []
        for i in range(300):
            if live and rng.random() < 0.35:
                lid = live.pop(rng.randrange(len(live)))
                for key in fleet.release(lid).gpu_keys():
                    assert taken.pop(key) == lid
                continue
            got = fleet.allocate(Request(f"{i}", rng.choice(SIZES), "H800"), policy)
            if isinstance(got, Placement):
                assert sum(len(s.gpus) for s in got.shares) == got.gpus, name
                for key in got.gpu_keys():
                    assert key not in taken, f"{name}: GPU {key} in two placements"
                    taken[key] = got.request_id
                live.append(got.request_id)
        assert fleet.free_gpus() == 2 * 56 * 8 - len(taken), name
        for lid in live:
            fleet.release(lid)
        assert fleet.free_gpus() == 2 * 56 * 8, name
        assert [c.su_free_counts() for c in fleet.clusters] == [[20, 20, 16]] * 2, name


def _busy_second_su(policy_name: str) -> Placement:
    """SU sizes 20, 20, 16 with 8 nodes of the second SU leased: free 20, 12, 16."""
    fleet = Fleet(make_spec([20, 20, 16]))
    fleet.occupy("busy", {f"c0-s2-n{n}": range(8) for n in range(8)})
    got = fleet.allocate(Request("s", 64, "H800"), POLICIES[policy_name])
    assert isinstance(got, Placement)
    return got


def test_baselines_choose_the_su_their_rule_names() -> None:
    assert _busy_second_su("first-fit").shares[0].su == 0  # fleet order
    assert _busy_second_su("first-su-fit").shares[0].su == 0  # the first SU that holds it
    assert _busy_second_su("slurm-tree").shares[0].su == 1  # the tightest leaf: 12 free
    assert _busy_second_su("kueue-tas").shares[0].su == 1  # the least free domain that fits
    assert _busy_second_su("ours").su_count == 1


def test_first_fit_spans_sus_where_the_topology_aware_policies_do_not() -> None:
    for name, sus in (("first-fit", 2), ("first-su-fit", 1), ("slurm-tree", 1), ("ours", 1)):
        fleet = Fleet(make_spec([16, 16]))
        fleet.occupy("busy", {f"c0-s1-n{n}": range(8) for n in range(12)})  # SU 0: 4 free
        got = fleet.allocate(Request("s", 64, "H800"), POLICIES[name])
        assert isinstance(got, Placement) and got.su_count == sus, name


def test_first_fit_hosts_take_unaligned_gpus_and_the_others_aligned_blocks() -> None:
    for name, gpus in (("first-fit", (1, 2)), ("first-su-fit", (2, 3)), ("ours", (2, 3))):
        fleet = Fleet(make_spec([2]))
        fleet.occupy("one", {"c0-s1-n0": [0]})
        got = fleet.allocate(Request("h", 2, "H800"), POLICIES[name])
        assert isinstance(got, Placement) and got.shares[0].gpus == gpus, name


def test_placeable_gpus_counts_aligned_blocks_and_structural_slices() -> None:
    fleet = Fleet(make_spec([16, 16]))
    assert placeable_gpus(fleet, "H800", 64) == 32 * 8  # two 8-node slices per SU
    assert placeable_gpus(fleet, "H800", 256) == 32 * 8  # 32 nodes over both SUs
    fleet.occupy("a", {"c0-s1-n0": [0, 3], "c0-s1-n1": range(8)})
    assert placeable_gpus(fleet, "H800", 1) == 32 * 8 - 10
    assert placeable_gpus(fleet, "H800", 2) == 30 * 8 + 2 * 2  # GPUs 1-2 are no aligned pair
    assert placeable_gpus(fleet, "H800", 4) == 30 * 8 + 4
    assert placeable_gpus(fleet, "H800", 8) == 30 * 8
    assert placeable_gpus(fleet, "H800", 64) == 24 * 8  # SU 0 keeps one 8-node slice
    assert placeable_gpus(fleet, "B200", 8) == 0


def test_stranded_gpus_are_free_gpus_no_demanded_size_can_use() -> None:
    fleet = Fleet(make_spec([16, 16]))
    fleet.occupy("a", {f"c0-s1-n{n}": range(8) for n in range(12)})  # SU 0: 4 whole nodes left
    assert stranded_gpus(fleet, "H800", 8, ()) == 4 * 8  # too few for an 8-node slice
    assert stranded_gpus(fleet, "H800", 4, ()) == 0
    assert stranded_gpus(fleet, "H800", 8, (1,)) == 0  # hosts can use them
    fleet.occupy("b", {"c0-s2-n0": [0, 2, 4, 6, 7]})  # free 1, 3, 5: no aligned pair
    assert stranded_gpus(fleet, "H800", 8, (2,)) == 3
    assert stranded_gpus(fleet, "H800", 8, (1,)) == 0
    assert stranded_gpus(fleet, "H800", None, ()) == 4 * 8 + 15 * 8 + 3


# ---------------------------------------------------------------------------------------------
# Stops/starts and node failures in the replay: production's rules, a consistent fleet
# ---------------------------------------------------------------------------------------------

EVENT_FLEET = """\
version: 1
gpu_models:
  - {code: H800, memory_gib: 80, nvlink_gbps: 200}
  - {code: RTX4090, memory_gib: 24}
demand:
  H800: {1: 2, 2: 1, 4: 1, 8: 1, 64: 3, 128: 1}
  RTX4090: {1: 2, 2: 2, 4: 1}
regions:
  - code: r1
    name: R1
    clusters:
      - code: h8
        gpu_model: H800
        fabric: ib-hdr
        gpus_per_node: 8
        scalable_units: [6, 6, 6]
        hostname: "h8-su{su:02d}-n{node:02d}"
        address: "10.1.{su}.{node}"
      - code: g4
        gpu_model: RTX4090
        fabric: ethernet
        gpus_per_node: 8
        nodes: 3
        su_nodes: 3
        hostname: "g4-r{su:02d}-n{node:02d}"
        address: "10.2.{su}.{node}"
"""


def _free_blocks(mask: int, gpn: int, size: int) -> list[int]:
    """The free aligned blocks of `size` GPUs in `mask` (as masks), computed here, bit by bit."""
    block = (1 << size) - 1
    return [block << st for st in range(0, gpn, size) if (mask >> st) & block == block]


def _is_aligned_block(mask: int, gpn: int, size: int) -> bool:
    return any(mask == (((1 << size) - 1) << st) for st in range(0, gpn, size))


class ReplayChecker:
    """The observer of a replay: checks the fleet and the instances after every event, and each
    start and replacement against production's rules on the state at that moment."""

    def __init__(self) -> None:
        self.tally: Counter[str] = Counter()

    def __call__(self, kind: str, sim: Any, facts: dict) -> None:
        getattr(self, kind)(sim, facts)

    def event(self, sim: Any, facts: dict) -> None:
        self.tally["events"] += 1
        fleet = sim.fleet
        held: dict[int, int] = {}
        for lid, lease in fleet.leases.items():
            for gid, m in lease.masks.items():
                assert held.get(gid, 0) & m == 0, f"GPUs {m:#x} of node {gid} in two leases"
                held[gid] = held.get(gid, 0) | m
                assert lid in fleet.node_leases[gid]
        for gid, leases in enumerate(fleet.node_leases):
            for lid in leases:
                assert gid in fleet.leases[lid].masks, f"node {gid} lists {lid}, which is elsewhere"
        for cl in fleet.clusters:
            for su, nodes in enumerate(cl.su_nodes):
                for gid in nodes:
                    assert fleet.node_mask[gid] == cl.full_mask & ~held.get(gid, 0), gid
                whole = [
                    g for g in nodes if fleet.node_ok[g] and fleet.node_mask[g] == cl.full_mask
                ]
                assert cl.su_free[su] == whole, (cl.code, su)
            assert cl.free_nodes == sum(len(f) for f in cl.su_free)
        holding = {lid for lid, i in sim.live.items() if i.state in ("running", "migrating")}
        assert set(fleet.leases) == holding  # a stopped instance holds no GPUs
        for lid, inst in sim.live.items():
            if inst.state == "running":
                assert all(fleet.node_ok[g] for g in fleet.leases[lid].masks), lid
                assert sim.ends[lid] > facts["now"] or sim.ends[lid] == facts["now"]
            elif inst.state == "migrating":  # it waits: some node of its lease is out of service
                assert not all(fleet.node_ok[g] for g in fleet.leases[lid].masks), lid
            else:
                assert lid not in sim.ends

    def start(self, sim: Any, facts: dict) -> None:
        fleet = sim.fleet
        home, node, mask = facts["home"], facts["node"], facts["mask"]
        cards = sim.live[facts["id"]].item.gpus
        gpn = fleet.cluster_of(node).gpn
        assert fleet.node_ok[node] and fleet.free_mask(node) & mask == mask
        assert bin(mask).count("1") == cards
        home_fits = fleet.node_ok[home] and _free_blocks(
            fleet.free_mask(home), fleet.cluster_of(home).gpn, cards
        )
        # claim_on_node: the same host whenever it is in service with an aligned block free, and
        # then an aligned block of it; else a placement anew (the policy's own host rule)
        assert (facts["path"] == "claim_on_node") == bool(home_fits), facts
        if facts["path"] == "claim_on_node":
            assert node == home and _is_aligned_block(mask, gpn, cards), facts
        if sim.policy.name != "first-fit":  # the others place hosts on aligned blocks too
            assert _is_aligned_block(mask, gpn, cards), facts
        self.tally[facts["path"]] += 1
        self.tally["same_host" if node == home else "moved"] += 1

    def replace(self, sim: Any, facts: dict) -> None:
        fleet = sim.fleet
        failed, node, mask = facts["failed"], facts["node"], facts["mask"]
        cl = fleet.cluster_of(failed)
        assert node != failed and not fleet.node_ok[failed] and fleet.node_ok[node]
        assert fleet.cluster_of(node) is cl  # inside the failed node's cluster
        assert fleet.free_mask(node) & mask == mask
        part = fleet.leases[facts["id"]].masks[failed]
        if not facts["whole"]:
            assert _is_aligned_block(mask, cl.gpn, bin(part).count("1"))
            self.tally["host_part"] += 1
            return
        assert mask == part == cl.full_mask
        whole_free = [g for g in cl.gids if fleet.node_ok[g] and fleet.free_mask(g) == cl.full_mask]
        su = fleet.node_su[failed]
        near_sus = {fleet.node_su[fleet.gid_by_hostname[h]] for h in facts["near"]}
        if any(fleet.node_su[g] == su for g in whole_free):
            self.tally["same_su_had_free"] += 1
            if fleet.node_su[node] != su:
                self.tally["same_su_missed"] += 1
        elif any(fleet.node_su[g] in near_sus for g in whole_free):
            self.tally["slice_su_had_free"] += 1
            if fleet.node_su[node] not in near_sus:
                self.tally["slice_su_missed"] += 1
        else:
            self.tally["elsewhere"] += 1


def _replay(policy: str, discipline: str, **events: Any) -> tuple[dict, Counter[str]]:
    bench = _bench()
    spec = parse_fleet(EVENT_FLEET)
    trace = bench.synthetic_trace(spec, 1.0, 500, seed=11)
    checker = ReplayChecker()
    config = bench.Events(
        stop_rate=events.get("stop_rate", 0.5),
        stop_hours=2.0,
        failure_rate=events.get("failure_rate", 0.01),
        repair_hours=events.get("repair_hours", 8.0),
        on_no_replacement=events.get("on_no_replacement", "wait"),
        seed=11,
    )
    sim = bench.Simulation(spec, policy, discipline, 4 * 3600.0, events=config, observer=checker)
    return sim.run(trace, 600.0), checker.tally


def test_replay_with_stops_and_failures_follows_production_and_keeps_the_fleet_consistent() -> None:
    for discipline in ("fifo-backfill", "loss"):
        result, seen = _replay("ours", discipline)
        starts, failures = result["starts"], result["failures"]
        assert seen["events"] > 500
        # every start went through the checker; the replay's counts are the ones it saw
        assert (starts["same_host"], starts["moved"]) == (seen["same_host"], seen["moved"])
        assert starts["same_host_replanned"] == 0  # ours: never the same node on a new plan
        assert starts["same_host"] > 0 and starts["moved"] > 0 and starts["waited"] > 0
        assert starts["stops"] >= starts["same_host"] + starts["moved"]
        # a slice's part stays in its SU whenever that SU has a whole free node, else goes to an
        # SU the slice uses when one has: both cases occurred, neither was missed
        assert seen["same_su_had_free"] > 0 and seen["same_su_missed"] == 0, seen
        assert seen["slice_su_had_free"] + seen["elsewhere"] > 0 and seen["slice_su_missed"] == 0
        assert seen["host_part"] > 0
        parts = failures["slice_parts"]
        assert parts["same_su"] > 0 and parts["same_su_missed"] == 0
        assert failures["host_parts"] > 0
        assert failures["nodes_failed"] > 10 and failures["waited"] > 0
        assert failures["replacement"] == "plan_replacement"
        hit = failures["instances_hit"]
        placed = failures["replaced_at_once"] + failures["waited"]
        assert hit == placed + failures["released_no_replacement"]
        assert failures["waited"] == (
            failures["replaced_after_wait"]
            + failures["resumed_on_repaired_node"]
            + failures["still_waiting_at_end"]
        )


def test_a_baseline_replays_the_same_events_and_misses_the_same_su() -> None:
    ours, _ = _replay("ours", "fifo-backfill")
    result, seen = _replay("first-fit", "fifo-backfill")
    assert result["failures"]["replacement"] == "one-node order"
    assert result["failures"]["nodes_failed"] == ours["failures"]["nodes_failed"]
    starts = result["starts"]
    assert starts["stops"] > 0 and (seen["same_host"], seen["moved"]) == (
        starts["same_host"],
        starts["moved"],
    )
    assert seen["claim_on_node"] > 0 and seen["plan"] > 0
    # first-fit takes the first free node in fleet order, whatever the failed node's SU
    assert seen["same_su_missed"] > 0
    assert result["failures"]["slice_parts"]["same_su_missed"] > 0


def test_without_a_replacement_an_instance_is_released_when_its_owner_chose_so() -> None:
    result, seen = _replay("ours", "loss", failure_rate=0.03, on_no_replacement="release")
    failures = result["failures"]
    assert failures["released_no_replacement"] > 0 and failures["waited"] == 0
    assert failures["lost_gpu_hours"] > 0
    assert seen["events"] > 0


def test_stops_and_failures_off_replay_exactly_as_before() -> None:
    bench = _bench()
    spec = parse_fleet(EVENT_FLEET)
    trace = bench.synthetic_trace(spec, 1.0, 300, seed=4)
    plain = bench.Simulation(spec, "ours", "fifo-backfill", 3600.0).run(trace, 600.0)
    off = bench.Simulation(spec, "ours", "fifo-backfill", 3600.0, events=bench.Events(seed=4)).run(
        trace, 600.0
    )
    on = bench.Simulation(
        spec, "ours", "fifo-backfill", 3600.0, events=bench.Events(0.5, 2.0, 0.01, seed=4)
    ).run(trace, 600.0)
    timing = ("alloc_latency_us", "alloc_cpu_us")
    assert "starts" not in plain and "failures" not in plain
    assert {k: v for k, v in off.items() if k not in timing} == {
        k: v for k, v in plain.items() if k not in timing
    }
    assert on["requests"] == plain["requests"] and "failures" in on


def test_a_waiting_instance_resumes_on_its_own_node_when_that_node_returns() -> None:
    result, seen = _replay("ours", "loss", failure_rate=0.02, repair_hours=0.5)
    failures = result["failures"]
    # production's drive_migration: a part whose node returned meanwhile keeps its cards
    assert failures["resumed_on_repaired_node"] > 0
    assert failures["node_repairs"] == failures["nodes_failed"]
    assert seen["same_su_missed"] == seen["slice_su_missed"] == 0
