"""The pure modules' one list (the first import-linter contract in pyproject.toml, read by
`.ci/pure-modules` for mypy --strict) names modules that exist and really import no Django, DRF,
Channels or Celery when imported on their own in a fresh interpreter (the contract checks the
source; this checks what Python actually loads, outside the app package's own ``__init__``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("django", "rest_framework", "channels", "celery")


def _pure_modules() -> list[str]:
    out = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "pure-modules")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split()
    # "-p pkg -m mod ..." pairs
    return [out[i + 1] for i in range(0, len(out), 2)]


def test_the_list_is_read_from_the_contract_and_names_real_modules() -> None:
    modules = _pure_modules()
    assert "slices.topology" in modules and "billing.money" in modules
    assert len(modules) == len(set(modules)) >= 10


@pytest.mark.parametrize("module", _pure_modules())
def test_a_pure_module_loads_without_django(module: str) -> None:
    # The app packages' own __init__ may load Celery (console's does, for the worker); a pure
    # module is checked on its own, so its top-level package is an empty namespace here.
    top = module.split(".")[0]
    probe = (
        "import importlib, sys, types\n"
        f"pkg = types.ModuleType({top!r}); pkg.__path__ = [{str(ROOT / top)!r}]\n"
        f"sys.modules[{top!r}] = pkg\n"
        f"importlib.import_module({module!r})\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"{module} loaded {result.stdout.strip()}"
