"""The queue discipline and the start estimator (pure modules: no database)."""

from __future__ import annotations

import math
import random

from slices.fleetfile import parse_fleet
from slices.topology import Fleet, Placement, Request
from slices.topology.estimate import DurationModel, Survival, estimate_starts, limits_estimate
from slices.topology.queue import Waiting, schedule
from tests.slices.factories import SMALL_FLEET


def small_spec():
    return parse_fleet(SMALL_FLEET)


def _full(fleet: Fleet, ends: float | None = None) -> list[str]:
    """Fill the H800 cluster with 64-GPU slices (ends known or not)."""
    ids = []
    n = 0
    while True:
        n += 1
        got = fleet.allocate(Request(f"s{n}", 64, "H800", None, 0.0, ends))
        if not isinstance(got, Placement):
            return ids
        ids.append(got.request_id)


def test_survival_conditions_on_elapsed_time():
    s = Survival([100.0, 200.0, 300.0, 400.0])
    assert s.remaining(0.0, 0.0) == 100.0
    # Having run 250 s, it is one of the two longer rentals: 50 or 150 s left.
    assert s.remaining(250.0, 0.0) == 50.0
    assert s.remaining(250.0, 0.9) == 150.0
    assert s.survival_at(250.0, 100.0) == 0.5
    # Past every measurement: a positive tail, never a negative time.
    assert s.remaining(1000.0, 0.5) > 0


def test_censored_rentals_keep_long_ones():
    ended = [100.0] * 10
    running = [1000.0] * 10  # still running after 1000 s
    with_censored = Survival(ended, running)
    without = Survival(ended)
    assert without.survival_at(0.0, 500.0) == 0.0
    assert with_censored.survival_at(0.0, 500.0) == 0.5


def test_fifo_head_first_and_backfill_only_with_known_short_limit():
    fleet = Fleet(small_spec())
    ids = _full(fleet, ends=1000.0)
    fleet.release(ids[0])  # one 64-GPU slice's nodes free
    queue = [
        Waiting("head", 128, "H800", None, 0.0, None, None),  # does not fit now
        Waiting("long", 64, "H800", None, 1.0, 5000.0, None),  # would outlast the shadow
        Waiting("open", 64, "H800", None, 2.0, None, None),  # unknown limit: never backfills
        Waiting("short", 64, "H800", None, 3.0, 500.0, None),  # ends before the shadow
    ]
    done = schedule(fleet, queue, 10.0)
    assert [w.id for w, _p in done.started] == ["short"]
    assert [w.id for w in done.kept] == ["head", "long", "open"]
    assert done.shadow == 1000.0


def test_no_backfill_when_the_shadow_is_unknown():
    fleet = Fleet(small_spec())
    ids = _full(fleet, ends=None)
    fleet.release(ids[0])
    queue = [
        Waiting("head", 128, "H800", None, 0.0, None, None),
        Waiting("short", 64, "H800", None, 1.0, 60.0, None),
    ]
    assert schedule(fleet, queue, 10.0).started == []
    assert [w.id for w, _ in schedule(fleet, queue, 10.0, blind_backfill=True).started] == ["short"]


def test_expired_requests_leave():
    fleet = Fleet(small_spec())
    _full(fleet)
    done = schedule(fleet, [Waiting("w", 64, "H800", None, 0.0, None, 5.0)], 10.0)
    assert [w.id for w in done.expired] == ["w"] and not done.kept


def test_known_ends_give_an_exact_estimate_and_positions():
    fleet = Fleet(small_spec())
    _full(fleet, ends=3600.0)
    queue = [
        Waiting("a", 64, "H800", None, 0.0, 7200.0, None),
        Waiting("b", 192, "H800", None, 1.0, None, None),
    ]
    est = estimate_starts(fleet, queue, 0.0, DurationModel([], []), samples=8)
    assert est["a"].p50 == est["a"].p90 == 3600.0 and est["a"].position == 1
    # b needs the whole cluster: after a (known limit) ends too.
    assert est["b"].p50 == est["b"].p90 == 3600.0 + 7200.0 and est["b"].position == 2


def test_range_is_ordered_and_baseline_is_later():
    fleet = Fleet(small_spec())
    ids = _full(fleet, ends=None)
    started = {lid: -random.Random(i).uniform(0, 3600) for i, lid in enumerate(ids)}
    queue = [Waiting("a", 128, "H800", None, 0.0, None, None)]
    rng = random.Random(1)
    model = DurationModel(
        [rng.expovariate(1 / 3600) for _ in range(200)],
        [rng.expovariate(1 / 7200) for _ in range(200)],
    )
    est = estimate_starts(fleet, queue, 0.0, model, started=started, samples=64)
    e = est["a"]
    assert e.p50 is not None and e.p90 is not None and 0 < e.p50 <= e.p90
    assert list(e.quantiles) == sorted(e.quantiles)  # type: ignore[type-var]
    slurm = limits_estimate(fleet, queue, 0.0, model.slices.longest, started=started)["a"]
    assert slurm is not None and slurm >= e.p90
    assert not math.isinf(e.p90)


def test_bench_replay_scores_both_estimates_on_the_same_starts(tmp_path):
    """bench/queue.py on the small fleet: traces round-trip, every queued request is scored
    against its real start, and the baseline is computed in the same run."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "queue.py"
    spec = importlib.util.spec_from_file_location("bench_queue", path)
    bq = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bq
    spec.loader.exec_module(bq)
    fleet_spec = small_spec()
    trace = bq.synthetic(fleet_spec, 1.2, 150, 3, 0.5)
    assert any(r.limit for r in trace) and not all(r.limit for r in trace)
    out = tmp_path / "t.jsonl"
    bq.write_trace(trace, out)
    assert bq.read_trace(out) == trace
    rep = bq.Replay(fleet_spec, 24 * 3600.0, 8, 1)
    rep.run(trace)
    got = bq.score(rep, slices_only=False)
    assert got["queued"] > 0
    assert 0 <= got["ours"]["p90_honoured"] <= 1 and 0 <= got["slurm_limits"]["p90_honoured"] <= 1
    # every request either started or left the queue: nothing is lost
    assert len(rep.real) + rep.expired == len(rep.items)
