"""bench/apps.py launches the chat app (llm-chat, the tiny model) on an sshd test host, serves the
console under uvicorn with nginx in front (the production edge) and times a streamed chat
completion through the console's API proxy and through the edge on the app's own host against
the app's server called directly; here in its reduced mode. The figures are the bench's
business, not a test's: that every part ran and printed its figures (numbers, parsed) and both
targets' verdicts for each way, that the streamed answers were the same every way, and that the app's server
was stopped at the end is asserted; no wall-clock target is."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import base_env

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "apps.py"
NUM = r"(\d+\.\d+)"


@pytest.mark.skipif(
    not (ROOT / "var" / "recipe-venv" / "bin" / "python").exists(),
    reason="var/recipe-venv is missing: run `make recipe-env` (the app's server needs its torch)",
)
def test_apps_bench_runs_every_part_in_quick_mode() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        capture_output=True,
        text=True,
        env=base_env(),
        timeout=600,
        cwd=ROOT,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr

    # 1. One launch, split into provisioning and the app's start; the total is their sum.
    launch = {}
    for key, label in (
        ("provisioning", r"provisioning \(order → running\)"),
        ("start", r"app start \(running → answering\)"),
        ("total", r"launch → answering \(the two\)"),
    ):
        found = re.search(rf"{label} +median +{NUM} s +\(each: {NUM}\)\n", out)
        assert found, out
        median, each = float(found[1]), float(found[2])
        assert median == each >= 0, out
        launch[key] = median
    assert launch["start"] > 0, out
    assert abs(launch["provisioning"] + launch["start"] - launch["total"]) <= 0.011, out

    # 2. Three streamed completions of 16 tokens each way, the same greedy answer every time.
    assert re.search(
        r"tokens = the usage's completion_tokens \(stream_options\.include_usage\): 16 per "
        r"answer, in \d+ content chunks; the same answer every time every way: yes\n",
        out,
    ), out
    paths = {}
    for key, label in (
        ("direct", r"direct \(127\.0\.0\.1:8000\)"),
        ("proxy", "through the console's proxy"),
        ("edge", r"through the edge \(nginx\)"),
    ):
        found = re.search(
            rf"{label} +first token p50 +{NUM} ms \(p90 {NUM}, min {NUM}, max {NUM}\) +"
            rf"tokens/s median +{NUM} +n=3\n",
            out,
        )
        assert found, out
        p50, _p90, low, high, rate = (float(g) for g in found.groups())
        assert 0 < low <= p50 <= high, out
        assert rate > 0, out
        paths[key] = (p50, rate)
    assert re.search(
        rf"the decode rate, .* direct {NUM}, through the proxy {NUM}, through the edge {NUM} "
        r"tokens/s",
        out,
    ), out
    for key, label in (("proxy", "the proxy"), ("edge", "the edge")):
        found = re.search(
            rf"{label}: first token ([+-]\d+\.\d+) ms against direct \(p50\), tokens/s "
            r"([+-]\d+\.\d+)%",
            out,
        )
        assert found, out
        assert float(found[1]) == pytest.approx(paths[key][0] - paths["direct"][0], abs=0.011)
        assert float(found[2]) == pytest.approx(
            (paths[key][1] / paths["direct"][1] - 1) * 100, abs=0.2
        )
        assert re.search(
            rf"target: {label} adds ≤ 10 ms to the first-token p50: [+-]\d+\.\d+ ms, "
            r"(met|missed)\n",
            out,
        ), out
        assert re.search(
            rf"target: {label} costs ≤ 5% of tokens/s: -?\d+\.\d+%, (met|missed)\n", out
        ), out
    # The app's server was stopped with its instance: port 8000 is free again.
    assert "the app's server stopped, port 8000 free" in out, out
