"""The console's two layers (pyproject.toml's import-linter contracts): every console module is
either a building block (imports no app) or part of the shell (may import every app), never both
and never neither, so a new module has to be placed before `make lint` can check it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = "The console's building blocks import no app and not the shell"
SHELL = "No app imports the console's shell"


def _contract(name: str) -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return next(c for c in config["tool"]["importlinter"]["contracts"] if c["name"] == name)


def _console_modules() -> set[str]:
    """Top-level modules and packages of console/ (a package counts with its submodules)."""
    out = set()
    for path in (ROOT / "console").iterdir():
        if path.name in {"migrations", "locale", "__pycache__", "__init__.py"}:
            continue
        if path.suffix == ".py":
            out.add(f"console.{path.stem}")
        elif (path / "__init__.py").is_file():
            out.add(f"console.{path.name}")
    return out


def test_every_console_module_is_in_exactly_one_layer() -> None:
    blocks = set(_contract(BLOCKS)["source_modules"])
    shell = set(_contract(SHELL)["forbidden_modules"])
    assert not blocks & shell, blocks & shell
    modules = _console_modules()
    assert modules - blocks - shell == set(), "place these in a layer in pyproject.toml"
    assert (blocks | shell) - modules == set(), "listed but not in console/"


def test_the_building_blocks_may_import_neither_the_apps_nor_the_shell() -> None:
    forbidden = set(_contract(BLOCKS)["forbidden_modules"])
    shell = set(_contract(SHELL)["forbidden_modules"])
    assert {"slices", "billing", "marketplace"} <= forbidden
    assert shell <= forbidden
