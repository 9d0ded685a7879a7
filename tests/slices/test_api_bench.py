"""bench/api.py serves the routes the load benchmark's API clients poll (their instances, their
wallet, one instance) from one uvicorn process on PostgreSQL, beside a trivial token-authenticated
route, and prints requests/s, latency and the web's CPU per request for each; here in its quick
mode (the figures are the bench's business: that every route was served without an error and the
summary carries them is asserted, no timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import base_env

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "api.py"
ROUTES = {"baseline: ssh-keys", "instances", "wallet", "instance"}


def test_quick_api_bench_serves_every_polled_route_and_prints_its_figures() -> None:
    env = {**base_env(), "DATABASE_URL": os.environ["DATABASE_URL"]}
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        cwd=BENCH.parents[1],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-4000:]
    lines = [line for line in out.splitlines() if line.startswith("summary: ")]
    assert len(lines) == 1, out[-4000:]
    summary = json.loads(lines[0].removeprefix("summary: "))
    assert summary["errors"] == 0 and summary["exited"] == []
    rows = {r["route"]: r for r in summary["rows"] if r["server"] == "this tree"}
    assert set(rows) == ROUTES
    for route, row in rows.items():
        assert row["requests"] > 0 and row["rps"] > 0, route
        assert row["p99_ms"] >= row["p50_ms"] > 0 and row["cpu_ms"] > 0, route
        assert row["db_cpu_ms"] is not None and row["db_cpu_ms"] >= 0, route  # a local server
    assert "CPU ms/req" in out and "closed-loop clients" in out
