"""The queue discipline and the start estimator (pure modules: no database)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

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
    rep = bq.Replay(fleet_spec, 24 * 3600.0, 8, 1, bq.synthetic_law(), True)
    rep.run(trace)
    got = bq.score(rep, slices_only=False)
    assert got["queued"] > 0
    assert 0 <= got["ours"]["p90_honoured"] <= 1 and 0 <= got["slurm_limits"]["p90_honoured"] <= 1
    # the bounds are scored on the same requests: the oracle (the law the trace is drawn from)
    # and the plan with every realised duration known
    assert 0 <= got["oracle"]["p50_within_5min"] <= 1
    assert 0 <= got["clairvoyant"]["p50_within_5min"] <= 1
    assert got["ours"]["width_p90_p50_s"] >= 0
    known = got["known_ends_only"]
    assert 0 <= known["queued"] <= got["queued"]
    assert "P50 within 5 min" in bq.summary({"trace": "t", "which": "all queued"} | got)
    # every request either started or left the queue: nothing is lost
    assert len(rep.real) + rep.expired == len(rep.items)


def test_quantile_is_the_rank_a_new_draw_honours():
    from slices.topology.estimate import quantile

    assert quantile([float(x) for x in range(1, 10)], 0.5) == 5.0  # rank 0.5·10 = 5
    assert quantile([float(x) for x in range(1, 10)], 0.9) == 9.0  # rank 0.9·10 = 9
    assert quantile([0.0, 10.0, 20.0, 30.0], 0.5) == 15.0  # rank 2.5: halfway
    assert quantile([1.0, 2.0, 3.0], 0.1) == 1.0  # before the first rank: the least seen
    assert quantile([1.0, math.inf], 0.9) is None  # beyond the futures' horizon
    # A real start drawn like the futures falls at or below the P90 of 19 futures 9 times in
    # 10 (the ⌈0.9·19⌉ = 18th of 19 is that rank; the old ⌈q·n⌉ rank on 8 futures, the largest,
    # is honoured 8 / 9 of the time).
    rng = random.Random(7)
    trials = 20_000
    hit = 0
    for _ in range(trials):
        futures = [rng.expovariate(1.0) for _ in range(19)]
        p90 = quantile(futures, 0.9)
        assert p90 is not None
        hit += rng.expovariate(1.0) <= p90
    assert abs(hit / trials - 0.9) < 0.01


def test_survival_sampler_is_the_conditional_law():
    """remaining(a, u) is the u-quantile of T − a given T > a: P(T > a + t | T > a) ≤ 1 − u."""
    s = Survival([float(d) for d in range(1, 1001)])  # uniform on 1..1000 s
    for a in (0.0, 250.0, 500.0, 900.0):
        draw = s.sampler(a)
        for u in (0.0, 0.1, 0.5, 0.9, 0.99):
            t = draw(u)
            assert t == s.remaining(a, u)
            assert s.survival_at(a, t) <= 1 - u + 1e-9
            assert s.survival_at(a, t - 1) > 1 - u - 1e-9  # the least such t
        # the remaining time after a is uniform on 1..1000 − a: its median is half of that
        assert abs(draw(0.5) - (1000 - a) / 2) <= 1


def test_lognormal_law_conditions_exactly():
    from slices.topology.estimate import LogNormal

    law = LogNormal(7200.0, 0.8, 300.0, 7 * 86400.0)
    assert math.isclose(law.remaining(0.0, 0.5), math.exp(law.mu), rel_tol=1e-6)
    assert law.remaining(0.0, 0.0001) == 300.0  # the mass clipped at 5 minutes
    for a in (0.0, 3600.0, 20000.0):
        for u in (0.1, 0.5, 0.9):
            t = law.remaining(a, u)
            assert math.isclose(law.survival_at(a, t), 1 - u, rel_tol=1e-5)
    assert law.remaining(8 * 86400.0, 0.5) == 0.0  # past the longest it can run


def _uniform_full(fleet: Fleet) -> dict[str, float]:
    """The H800 cluster (3 slices of 64) full of open-ended slices that have run 500 s."""
    return dict.fromkeys(_full(fleet, ends=None), -500.0)


def _uniform_model() -> DurationModel:
    s = Survival([float(d) for d in range(1, 1001)])  # uniform on 1..1000 s
    return DurationModel.known(s, s)


def test_start_is_the_order_statistic_of_the_occupants_remaining_times():
    """Three occupants have run 500 s of a uniform 1..1000 s law: each has U(0, 500] left. A
    64-GPU slice starts when the first of them ends (the least of three), a 192-GPU one when
    the last does: medians 500·(1 − 0.5^⅓) ≈ 103 s and 500·0.5^⅓ ≈ 397 s, not the 250 s a
    median per occupant would give."""
    for gpus, p50, p90 in (
        (64, 500 * (1 - 0.5 ** (1 / 3)), 500 * (1 - 0.1 ** (1 / 3))),
        (192, 500 * 0.5 ** (1 / 3), 500 * 0.9 ** (1 / 3)),
    ):
        fleet = Fleet(small_spec())
        started = _uniform_full(fleet)
        queue = [Waiting("a", gpus, "H800", None, 0.0, None, None)]
        est = estimate_starts(
            fleet, queue, 0.0, _uniform_model(), started=started, samples=4000, adaptive=False
        )["a"]
        assert est.p50 is not None and est.p90 is not None
        assert abs(est.p50 - p50) < 0.04 * 500, (gpus, est.p50, p50)
        assert abs(est.p90 - p90) < 0.04 * 500, (gpus, est.p90, p90)


def test_a_request_ahead_that_outwaits_its_maximum_leaves_the_plan():
    """With ``deadlines``, a head that cannot start before its maximum wait leaves the queue in
    every future, as admission makes it, and the one behind it moves up; without (the default),
    it is counted as waiting on."""
    fleet = Fleet(small_spec())
    _full(fleet, ends=3600.0)
    behind = Waiting("b", 64, "H800", None, 1.0, None, None)
    stuck = Waiting("a", 192, "H800", None, 0.0, 7200.0, None)  # the whole cluster, for 2 h
    est = estimate_starts(fleet, [stuck, behind], 0.0, DurationModel([], []), samples=8)
    assert est["b"].p50 == 3600.0 + 7200.0  # waits for it
    gone = replace(stuck, deadline=1800.0)  # it gives up before the cluster frees
    est = estimate_starts(fleet, [gone, behind], 0.0, DurationModel([], []), samples=8)
    assert est["b"].p50 == 3600.0 + 7200.0
    est = estimate_starts(
        fleet, [gone, behind], 0.0, DurationModel([], []), samples=8, deadlines=True
    )
    assert est["a"].p50 is None
    assert est["b"].p50 == 3600.0


def test_the_futures_backfill_as_the_discipline_does():
    """The queue of the discipline's own test: the futures start "short" now, as `schedule`
    does (it fits and its limit ends before the head's shadow), and nobody else ahead of the
    head; with the occupants' ends unknown (no shadow) nothing backfills."""
    fleet = Fleet(small_spec())
    ids = _full(fleet, ends=1000.0)
    fleet.release(ids[0])
    queue = [
        Waiting("head", 128, "H800", None, 0.0, None, None),
        Waiting("long", 64, "H800", None, 1.0, 5000.0, None),
        Waiting("open", 64, "H800", None, 2.0, None, None),
        Waiting("short", 64, "H800", None, 3.0, 500.0, None),
    ]
    est = estimate_starts(fleet, queue, 10.0, DurationModel([], []), samples=8)
    assert est["short"].p50 == est["short"].p90 == 10.0  # backfilled at once
    assert est["head"].p50 == 1000.0  # not delayed: short ends at 510, before the shadow
    assert est["long"].p50 is not None and est["long"].p50 >= 1000.0  # waits its turn

    fleet = Fleet(small_spec())
    ids = _full(fleet, ends=None)
    fleet.release(ids[0])
    est = estimate_starts(fleet, queue, 10.0, _uniform_model(), samples=8)
    assert est["short"].p50 is not None and est["short"].p50 > 10.0


def test_a_given_future_replays_exactly():
    """replay_starts (the benchmark's clairvoyant bound): occupants ending at 100, 200 and 300 s;
    a 128-GPU slice starts at the second end, the 64-GPU one behind it at the third (the first
    holds the other two thirds for 1,000 s)."""
    from slices.topology.estimate import replay_starts

    fleet = Fleet(small_spec())
    ids = _full(fleet, ends=None)
    ends = dict(zip(ids, (100.0, 200.0, 300.0), strict=True))
    queue = [
        Waiting("a", 128, "H800", None, 0.0, None, None),
        Waiting("b", 64, "H800", None, 1.0, None, None),
    ]
    got = replay_starts(fleet, queue, 0.0, ends, [1000.0, 50.0])
    assert got == {"a": 200.0, "b": 300.0}
