"""The α–β NCCL model."""

from __future__ import annotations

from slices.perf import allreduce_time_us, expected_performance


def test_busbw_is_the_slowest_link_and_algbw_follows_the_ring_factor() -> None:
    p = expected_performance(16, 8, 1, fabric="ib-hdr", rails=8, nvlink_gbps=200)
    assert p.busbw_gbps == 160.0  # NVLink ring (200 GB/s × 0.8) is below 8 × 24 GB/s of rails
    n = 128
    assert abs(p.algbw_gbps - round(p.busbw_gbps / (2 * (n - 1) / n), 1)) < 0.05
    few_rails = expected_performance(16, 8, 1, fabric="ib-hdr", rails=4, nvlink_gbps=200)
    assert few_rails.busbw_gbps == 96.0


def test_latency_grows_with_nodes_and_switch_level() -> None:
    one_su = expected_performance(16, 8, 1)
    two_su = expected_performance(16, 8, 2)
    more = expected_performance(64, 8, 4)
    assert one_su.allreduce_small_us < two_su.allreduce_small_us < more.allreduce_small_us
    assert one_su.fabric_latency_us < two_su.fabric_latency_us < 7.0
    assert one_su.busbw_gbps == two_su.busbw_gbps  # non-blocking: no bandwidth lost across SUs


def test_alpha_beta_curve_meets_both_regimes() -> None:
    p = expected_performance(8, 8, 1)
    assert allreduce_time_us(p, 8) >= p.allreduce_small_us
    big = allreduce_time_us(p, 1 << 30)
    assert big > 100 * p.allreduce_small_us
    n = p.gpus
    assert abs(big - (1 << 30) * 2 * (n - 1) / n / (p.busbw_gbps * 1e3)) < p.allreduce_small_us + 1
