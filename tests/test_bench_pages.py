"""bench/pages.py times every customer page for an account of 20 instances on the shipped fleet
against a trivial view behind the same middleware; here in its reduced mode. The figures are the
bench's business, not a test's: that it exits 0 (every page answered 200), that the table has the
baseline line and one parsed line per page (numbers, queries, the ``over`` mark only above the
target), that the summary counts them, and that the slowest page's statement shapes are printed
is asserted; no timing is."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.servers import base_env

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "pages.py"
ROW = re.compile(
    r"^   (?P<label>\S.*?) +(?P<p50>\d+\.\d) +(?P<p95>\d+\.\d) +(?P<queries>\d+) +"
    r"(?P<ratio>\d+\.\d)(?P<over>  over)?$"
)
# Pages the brief names: each must have its line.
EXPECTED = (
    "dashboard",
    "instances (default: active)",
    "instances ?state=all",
    "instance: 8-card host",
    "instance: 128-card slice",
    "order form",
    "order preview 128 × A800 (htmx)",
    "marketplace ?q=qwen",
    "model page",
    "images",
    "demo llama-7b",
    "apps",
    "app llm-chat",
    "billing",
    "statement",
    "prices",
    "disks",
)


def test_pages_bench_prints_a_parsed_line_per_page_and_the_baseline_in_quick_mode() -> None:
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
    assert re.search(r"the customer's 20 instances \(.*\d+ running.*\d+ stopped", out), out
    assert "5 requests each after 1 warm-up" in out, out

    header = out.index("p50 ms")
    rows = {}
    for line in out[header:].splitlines()[1:]:
        found = ROW.match(line)
        if not found:
            break
        rows[found["label"]] = found
    assert list(rows)[0] == "baseline: trivial view", out
    base = rows.pop("baseline: trivial view")
    assert float(base["ratio"]) == 1.0 and not base["over"], out
    assert set(EXPECTED) <= set(rows), sorted(set(EXPECTED) - set(rows))
    for label, row in rows.items():
        p50, p95, queries = float(row["p50"]), float(row["p95"]), int(row["queries"])
        assert 0 < p50 <= p95, (label, out)
        assert queries > 0, (label, out)
        assert bool(row["over"]) == (p95 > 100.0), (label, out)
    over = sum(1 for row in rows.values() if row["over"])
    summary = f"{len(rows)} pages: {len(rows) - over} within 100 ms p95, {over} over"
    assert summary in out, out

    shapes = re.search(
        r"slowest page: .+ \(/.*\), p95 \d+\.\d ms, (\d+) queries, \d+ shapes; the three most "
        r"frequent:\n((?:   ×\d+ +\S.*\n){1,3})",
        out,
    )
    assert shapes, out
    assert "verdict:" in out, out
