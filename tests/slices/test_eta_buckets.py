"""bench/provisioning.py scores the first ETA per size bucket (issue 32): the orders are spread
evenly over the buckets, and the target must hold in each, not only over all orders."""

from __future__ import annotations

from collections import Counter

from bench.provisioning import ETA_BUCKETS, ETA_TARGET, _eta_report, eta_schedule


def test_the_scored_orders_cover_every_bucket_evenly() -> None:
    sizes = eta_schedule(36)
    per_bucket = Counter(ETA_BUCKETS[s] for s in sizes)
    assert set(per_bucket) == {"1", "2/4", "8", "64", "128", "256"}
    assert set(per_bucket.values()) == {6}
    assert Counter(s for s in sizes if ETA_BUCKETS[s] == "2/4") == {2: 3, 4: 3}
    assert sizes != sorted(sizes)  # shuffled: no bucket's orders all at the end
    assert eta_schedule(36) == sizes  # the same order in every run


def test_one_bucket_off_target_misses_although_the_overall_median_meets_it(capsys) -> None:
    good = [(2.0, ETA_TARGET / 10, 0.2, 0.01)] * 5
    scored = {b: list(good) for b in ("1", "8", "64", "256")}
    scored["128"] = [(2.36, 0.5, 0.15, 0.5)] * 3 + [
        (2.36, 0.01, 0.15, 0.01)
    ] * 2  # the 128-card case
    assert _eta_report(scored) is False
    out = capsys.readouterr().out
    assert "128 cards: n=5" in out and "MISSED" in out
    assert "target ≤ 10% in every bucket: MISSED" in out
    scored["128"] = list(good)
    assert _eta_report(scored) is True
