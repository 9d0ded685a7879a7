"""Every benchmark starts the way the README runs it (``python bench/NAME.py``). Python puts the
script's own folder first on the path, where ``bench/queue.py`` would stand in for the standard
library's ``queue`` (asgiref's thread pool, logging's handlers): each script takes its folder off."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import base_env

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if "__main__" in p.read_text())


def test_a_bench_named_like_a_stdlib_module_is_there() -> None:
    # The guard below means something only while the shadowing name exists.
    assert (BENCH / "queue.py").exists()
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_script_starts_from_its_own_folder(script: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        env=base_env(),
        timeout=120,
        cwd=BENCH.parent,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "usage" in done.stdout.lower(), done.stdout
