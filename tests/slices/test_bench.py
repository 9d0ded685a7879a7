"""The allocator benchmark's pieces: trace format, seeded generator, one small replay."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from slices.fleetfile import parse_fleet
from tests.slices.factories import SMALL_FLEET

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
