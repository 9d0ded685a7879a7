"""bench/access.py serves the console under uvicorn in front of an instance on an sshd test host and
measures the web terminal and the port proxy against the direct paths; here in its reduced mode.
The figures are the bench's business, not a test's: that every part ran, reported its figures
and its target, and that 5 terminals and 5 proxied downloads at once all worked (no 5xx, every
download intact) is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.servers import base_env

BENCH = Path(__file__).resolve().parents[1] / "bench" / "access.py"
MS = r"\d+\.\d+ ms"


def test_access_bench_runs_every_part_in_quick_mode() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        capture_output=True,
        text=True,
        env=base_env(),
        timeout=600,
        cwd=BENCH.parents[1],
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    # 1. Echo through the console against a direct SSH PTY, 50 keystrokes each.
    assert re.search(rf"direct SSH PTY \(paramiko\) +p50 +{MS} +p99 +{MS} .*n=50\n", out), out
    assert re.search(rf"through the console +p50 +{MS} +p99 +{MS} .*n=50\n", out), out
    assert re.search(rf"console p99 ≤ 2 × direct p99 \+ 20 ms = {MS}: {MS}, (met|MISSED)\n", out), (
        out
    )
    # 2. Throughput through the proxy against direct TCP (and the tunnel alone, for reference).
    for label in (
        "direct TCP to http.server",
        "through the edge (nginx + OpenSSH)",
        "through the console's proxy",
        "tunnel alone",
    ):
        assert re.search(rf"{re.escape(label)}.* median +\d+\.\d+ MB/s .*n=1\)", out), out
    assert re.search(r"console CPU while it relayed: .* ms per MB", out), out
    assert re.search(r"console ≥ 50% of direct: \d+\.\d+%, (met|MISSED) ", out), out
    # The production edge (issue 34): nginx moved the bytes, the console only answered its auth.
    assert re.search(r"edge ≥ 50% of direct: \d+\.\d+%, (met|MISSED)\n", out), out
    assert re.search(r"edge CPU while it moved .* nginx \+ ssh .* ms per MB", out), out
    # The edge's forward alone with each cipher it may use, and which was fastest.
    for cipher in ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305"):
        assert re.search(
            rf"{re.escape(cipher)}\S* +median +\d+\.\d+ MB/s = \d+\.\d+% of direct .*n=1\)", out
        ), out
    assert re.search(r"fastest here: \S+@openssh\.com", out), out
    # 3. Five terminals and five downloads at once: all of them worked.
    assert "terminals: 5 of 5 opened, 5 open at once" in out, out
    assert "downloads: 5 of 5 intact, 10 MB" in out, out
    assert "target: no 5xx and no error: 0 5xx, 0 error(s), met" in out, out
    assert re.search(r"console CPU: .* cores per MB/s", out), out
    assert "verdict:" in out
