"""bench/provisioning.py runs standalone (its own SQLite file, the shipped fleet, sshd test hosts)
and prints both figures; here in its reduced mode. The figures are the bench's business, not a
test's: only that each part ran to running and reported is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.servers import base_env

BENCH = Path(__file__).resolve().parents[2] / "bench" / "provisioning.py"


def test_provisioning_bench_runs_both_parts_in_quick_mode() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        capture_output=True,
        text=True,
        env=base_env(),
        timeout=600,
        cwd=BENCH.parents[1],
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"16 nodes: median \d+\.\d+ s .*n=1", out), out
    assert re.search(r"target ≤ 2\.0 s: (met|MISSED)", out)
    assert re.search(r"1 node on 1 host: +median \d+\.\d+ s", out), out
    assert re.search(r"8 nodes on 2 hosts: +median \d+\.\d+ s", out), out
    assert re.search(r"ratio \d+\.\d+ × one host", out), out
