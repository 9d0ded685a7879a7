"""bench/soak.py runs the embedded stack's real code (sim driver, reconciler, telemetry relay, the
real ``check_node_health``) on a simulated clock with idle hosts, 无卡模式 runs, new starts and real
outages; here for half a simulated hour. No healthy host may be failed, and a host that really
stops answering must be, its instances moved off it (issue 29)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.servers import base_env

BENCH = Path(__file__).resolve().parents[1] / "bench" / "soak.py"


def _soak() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # At 1/20 of real time rather than the bench's 1/50: the beat keeps up on a loaded machine.
        [sys.executable, str(BENCH), "--quick", "--scale", "0.05"],
        capture_output=True,
        text=True,
        env=base_env(),
        timeout=600,
        cwd=BENCH.parents[1],
        check=False,
    )


def test_soak_fails_no_healthy_host_and_every_silent_one() -> None:
    done = _soak()
    out = done.stdout
    if "(the silent ones: 0)" in out:
        # The harness stages its outage on a host running instances at that simulated moment;
        # on a loaded machine a quick run can end before one was staged (nothing was judged).
        # A second run is a new random workload; the judgement below is never retried.
        done = _soak()
        out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert re.search(r"soak: 0\.\d+ simulated hours in \d+ s real \(SIM_TIME_SCALE 0\.05", out)
    assert re.search(r"workload on yc-4090-1 \(64 hosts × 8 RTX 4090\): [1-9]\d* orders", out), out
    assert "healthy hosts failed (new rule: the node's own answers): 0 (target 0)" in out, out
    assert re.search(r"healthy hosts failed \(old rule: GPU samples as heartbeats, same run\)", out)
    silent = re.findall(r"silent host \S+ \((gpu|gpuless) instance\): failed \d+ s after", out)
    assert "gpu" in silent, out  # the outage under a GPU instance is always staged
    assert "NOT failed" not in out and "error ×" not in out, out
    assert out.rstrip().endswith("verdict: met"), out
