"""bench/telemetry.py runs standalone: its own SQLite file, redis-server, uvicorn process and
websocket clients; the quick run streams a 64-GPU slice for a few seconds and prints the table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.servers import base_env

BENCH = Path(__file__).resolve().parents[2] / "bench" / "telemetry.py"


def test_quick_bench_delivers_every_sample_and_prints_the_figures() -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        cwd=BENCH.parents[1],
        capture_output=True,
        text=True,
        env=base_env(),
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "relay: 64 GPUs at 1 Hz" in out
    rows = re.findall(
        r"^\s+(\d+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(\d+)\s+(\d+)\s+(-?\d+)", out, re.M
    )
    assert [int(r[0]) for r in rows] == [1, 3]
    for clients, received, owed, skipped, dropped in ((int(x) for x in r) for r in rows):
        assert received >= clients  # every client got samples
        assert dropped == 0  # nothing owed was lost on the way
        assert owed == received + skipped
