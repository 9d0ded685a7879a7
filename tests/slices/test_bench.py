"""The allocator benchmark's pieces: trace format, seeded generator, one small replay."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path
from types import ModuleType

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
