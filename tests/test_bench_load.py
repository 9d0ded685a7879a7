"""bench/load.py drives the production stack as ``make prod`` runs it (PostgreSQL, a private Redis,
every Procfile process) with API clients, browser sessions, telemetry websockets and orders; the
quick run completes and prints its figures (not the targets: this machine's speed is not tested)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import base_env

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[1] / "bench" / "load.py"


def test_quick_load_run_reaches_every_part_of_the_stack_and_prints_the_figures() -> None:
    env = {**base_env(), "DATABASE_URL": os.environ["DATABASE_URL"]}
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        cwd=BENCH.parents[1],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("summary: ")]
    assert len(lines) == 1, result.stdout[-4000:]
    summary = json.loads(lines[0].removeprefix("summary: "))

    routes = {r["route"]: r for r in summary["routes"]}
    for route in ("api:instances", "api:wallet", "api:instance", "page:dashboard", "page:instance"):
        assert routes[route]["requests"] > 0, route  # every kind of client was served
        assert routes[route]["p99_ms"] >= routes[route]["p50_ms"] > 0
    assert summary["requests"] == sum(
        r["requests"] for r in summary["routes"] if r["route"][:2] != "ws"
    )
    assert {g["route"] for g in summary["groups"]} >= {"api", "page", "order"}
    assert summary["orders"]["placed"] > 0
    telemetry = summary["telemetry"]
    assert telemetry["sockets"] == 10 and telemetry["samples"] > 0  # the relay reached the sockets
    assert telemetry["interval_p99_s"] >= telemetry["interval_p50_s"] > 0
    postgres = summary["postgres"]
    assert 0 < postgres["peak_connections"] <= postgres["max_connections"]
    assert summary["cpu_cores"]["generator"] > 0 and summary["cpu_cores"]["web"] > 0
    assert set(summary["targets"]) >= {"no errors", "API p99 < 500 ms"}
    assert "verdict:" in result.stdout and "PostgreSQL: peak" in result.stdout

    # The capacity curves after the mixed load, through the edge (the default), on the same stack.
    assert summary["plan"]["through_edge"] is True
    curves = summary["capacity"]["curves"]
    assert set(curves) == {"read (ASGI, edge)", "trivial (ASGI, edge)"}
    for curve in curves.values():
        steps = curve["steps"]
        assert steps, curve
        rates = [s["offered"] for s in steps]
        assert rates == sorted(rates) and rates[0] == summary["plan"]["rates"][0]
        for step in steps:
            assert step["sent"] == step["answered"] + step["errors"]
            assert step["generator_cpu"] > 0  # the generator's own CPU beside every figure
        # The capacity is the last step of the unbroken run of passing ones (0 if none passed).
        passed = [s["offered"] for s in steps if s["passed"]]
        first_miss = next((s["offered"] for s in steps if not s["passed"]), None)
        if first_miss is not None:
            assert steps[-1]["offered"] == first_miss  # the curve stops at its first miss
        assert curve["capacity_rps"] == (max(passed) if passed else 0.0)
    ratios = summary["capacity"]["ratios"]
    read, trivial = curves["read (ASGI, edge)"], curves["trivial (ASGI, edge)"]
    if trivial["capacity_rps"]:
        assert ratios["read/trivial ASGI"] == read["capacity_rps"] / trivial["capacity_rps"]
    assert "read capacity >= 0.5 x trivial" in summary["targets"]
    assert (
        "generator CPU" in result.stdout and "capacity (the highest offered rate" in result.stdout
    )
