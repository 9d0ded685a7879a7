"""Recipes of the catalogue: a workload ready to run, such as the one-click LLaMA-7B demo.

Each recipe is a directory of ``marketplace/recipes/`` with a ``manifest.yaml`` (the image, the
model and dataset it mounts, the cards, the time limit, the entrypoint, the environment) and the
files the image runs (``train.py``...). This module only reads and checks them: no Django, no money.
The demo page (``slices.services.recipes``) prices a recipe on the current price book and orders it.

Bounds: a run's parameters decide how much work it is (steps, how often it logs and saves, batch
and sequence sizes), for the node and for the console that follows its output. Every parameter
named in ``PARAMETER_LIMITS`` is bounded whatever a manifest says (the loader's fixed limits); a
manifest's ``bounds`` narrows them (never widens them) and may bound more names. The loader checks
a manifest's defaults against them, and every launch checks what it actually runs (the console
may add values), refusing with the parameter and its bound (``ParameterOutOfBounds``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from marketplace.catalogue import CatalogueError, gpu_code, is_valid_hub_id, is_valid_slug
from marketplace.manifests import ENV_NAME, manifest_text, read_all, read_manifest

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
BUDGETS = {"trial_credit", "balance"}  # balance: what the account can spend
MAX_TIME_LIMIT_MINUTES = 24 * 60
MAX_SLURM_NODES = 16

# The loader's fixed limits (least, most) of the parameters a recipe's work grows with.
PARAMETER_LIMITS: dict[str, tuple[int, int]] = {
    "MAX_STEPS": (1, 100_000),
    "SAVE_EVERY": (0, 100_000),  # 0: no checkpoint before the last one
    "EVAL_EVERY": (0, 100_000),  # 0: no evaluation
    "LOG_EVERY": (1, 100_000),
    "BATCH_SIZE": (1, 1024),
    "SEQ_LEN": (1, 131_072),
    "LORA_R": (1, 1024),
}
# What a run may print and save, whatever its steps: the progress lines (MAX_STEPS / LOG_EVERY)
# and the checkpoints (MAX_STEPS / SAVE_EVERY). They raise the least LOG_EVERY and SAVE_EVERY.
MAX_PROGRESS_LINES = 10_000
MAX_CHECKPOINTS = 200


class ParameterOutOfBounds(ValueError):
    """A run parameter outside its bounds (or not a whole number): names it and the bounds."""

    def __init__(self, name: str, value: str, low: int, high: int) -> None:
        self.name, self.value, self.low, self.high = name, value, low, high
        super().__init__(f"{name} must be a whole number from {low} to {high}, not {value!r}")


def _whole(value: object) -> int | None:
    text = str(value).strip()
    if not re.fullmatch(r"[+-]?[0-9]{1,12}", text):  # no 4,000-digit numbers to parse
        return None
    return int(text)


def effective_bounds(
    bounds: Mapping[str, tuple[int, int]], env: Mapping[str, str]
) -> dict[str, tuple[int, int]]:
    """``bounds`` with the least LOG_EVERY and non-zero SAVE_EVERY raised so that a run of
    ``env``'s MAX_STEPS prints and saves at most ``MAX_PROGRESS_LINES`` / ``MAX_CHECKPOINTS``."""
    out = dict(bounds)
    steps = _whole(env.get("MAX_STEPS", "")) or 0
    for name, most in (("LOG_EVERY", MAX_PROGRESS_LINES), ("SAVE_EVERY", MAX_CHECKPOINTS)):
        if name in out and steps > most:
            low, high = out[name]
            value = _whole(env.get(name, ""))
            if name == "SAVE_EVERY" and value == 0 and low <= 0:
                continue  # no intermediate checkpoint at all
            out[name] = (max(low, -(-steps // most)), high)
    return out


def check_parameters(bounds: Mapping[str, tuple[int, int]], env: Mapping[str, str]) -> None:
    """Raise ``ParameterOutOfBounds`` for the first of ``env``'s bounded parameters outside its
    bounds (``effective_bounds``); names without a bound are not parameters of the run."""
    for name, (low, high) in effective_bounds(bounds, env).items():
        if name not in env:
            continue
        value = _whole(env[name])
        if value is None or not low <= value <= high:
            raise ParameterOutOfBounds(name, str(env[name])[:40], low, high)


@dataclass(frozen=True)
class Recipe:
    slug: str
    demo: str  # the demo page's name: /demo/<demo>/
    name: str
    name_zh: str
    summary: str
    summary_zh: str
    image: str  # an image version slug
    model: str  # a model hub id
    dataset: str  # a dataset hub id
    gpu_model: str  # a fleet GPU model code ("RTX4090")
    cards: int
    time_limit_minutes: int
    budget: str
    entrypoint: str
    directory: Path
    alternatives: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    # (least, most) of each bounded parameter: the loader's fixed limits, narrowed by the manifest.
    bounds: dict[str, tuple[int, int]] = field(default_factory=lambda: dict(PARAMETER_LIMITS))
    # The multi-node Slurm run (issue 31): its node count and its batch script (a file of the
    # recipe's directory); 0 / "" = the recipe is not offered on Slurm.
    slurm_nodes: int = 0
    slurm_script: str = ""
    slurm_gpu_model: str = ""
    slurm_slice_cards: int = 0
    slurm_budget: str = ""
    gpus_per_node: int = 0  # a Slurm run's cards per node (the one-node run's ``cards``)
    # "torchrun" (one node, the entrypoint) or "slurm" (``on_slurm()``: a job on a slice).
    mode: str = "torchrun"

    @property
    def offers_slurm(self) -> bool:
        return self.slurm_nodes > 1 and bool(self.slurm_script)

    def on_slurm(self) -> Recipe:
        """The recipe as its multi-node Slurm job: ``slurm_nodes`` whole nodes of ``cards``."""
        if not self.offers_slurm:
            raise ValueError(f"{self.slug} has no Slurm run")
        if self.mode == "slurm":
            return self
        return replace(
            self,
            cards=self.slurm_slice_cards,
            gpu_model=self.slurm_gpu_model,
            alternatives=(),
            budget=self.slurm_budget,
            gpus_per_node=self.cards,
            mode="slurm",
        )

    @property
    def cards_per_node(self) -> int:
        return self.gpus_per_node or self.cards

    def batch_script(self) -> str:
        """The Slurm batch script's text (catalogue data, never a customer's)."""
        return (self.directory / self.slurm_script).read_text()

    def check_parameters(self, env: Mapping[str, str]) -> None:
        """Refuse (``ParameterOutOfBounds``) a run environment outside the recipe's bounds."""
        check_parameters(self.bounds, env)

    def checkpoint_path(self, run: str, step: int) -> str:
        """Where step ``step`` of run ``run`` is saved, relative to the user's /pfs."""
        return self.outputs["checkpoints"].format(run=run, step=step)

    def adapter_path(self, run: str) -> str:
        return self.outputs["adapter"].format(run=run)

    def localized_name(self, language: str) -> str:
        return self.name_zh if language.startswith("zh") and self.name_zh else self.name

    def localized_summary(self, language: str) -> str:
        return self.summary_zh if language.startswith("zh") and self.summary_zh else self.summary


def _positive_int(data: dict[str, Any], key: str, where: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CatalogueError(f"{where}: {key} must be a positive whole number, not {value!r}")
    return value


def read_recipe(directory: Path) -> Recipe:
    """One recipe directory; ``CatalogueError`` names the file and the field it cannot use."""
    manifest = read_manifest(directory, "recipe")
    data, where = manifest.data, manifest.where
    slug = manifest.slug()
    demo = manifest_text(data, "demo", where)
    if not is_valid_slug(demo):
        raise CatalogueError(f"{where}: demo {demo!r} is not a valid slug")
    for key in ("model", "dataset"):
        if not is_valid_hub_id(manifest_text(data, key, where)):
            raise CatalogueError(f"{where}: {key} {data[key]!r} is not a hub id")
    image = manifest.image()
    minutes = _positive_int(data, "time_limit_minutes", where)
    if minutes > MAX_TIME_LIMIT_MINUTES:
        raise CatalogueError(f"{where}: time_limit_minutes above {MAX_TIME_LIMIT_MINUTES}")
    gpu_model = gpu_code(manifest_text(data, "gpu_model", where))
    alternatives = tuple(gpu_code(str(a)) for a in data.get("alternatives") or ())
    if not gpu_model or "" in alternatives:
        raise CatalogueError(f"{where}: gpu_model and alternatives must be known GPU models")
    budget = manifest_text(data, "budget", where)
    if budget not in BUDGETS:
        raise CatalogueError(f"{where}: budget must be one of {sorted(BUDGETS)}")
    files = manifest.files()
    env = manifest.env()
    bounds = _bounds(data.get("bounds"), where)
    try:
        check_parameters(bounds, env)
    except ParameterOutOfBounds as exc:
        raise CatalogueError(f"{where}: env {exc}") from exc
    outputs = data.get("outputs") or {}
    if not isinstance(outputs, dict) or {"checkpoints", "adapter"} - set(outputs):
        raise CatalogueError(f"{where}: outputs needs checkpoints and adapter")
    for key, template in outputs.items():
        text = str(template)
        if text.startswith("/") or ".." in text.split("/"):
            raise CatalogueError(f"{where}: outputs.{key} must stay inside /pfs")
    slurm = _slurm(data.get("slurm"), files, where)
    return Recipe(
        slug=slug,
        demo=demo,
        name=manifest_text(data, "name", where),
        name_zh=manifest_text(data, "name_zh", where, required=False),
        summary=manifest_text(data, "summary", where),
        summary_zh=manifest_text(data, "summary_zh", where, required=False),
        image=image,
        model=str(data["model"]),
        dataset=str(data["dataset"]),
        gpu_model=gpu_model,
        cards=_positive_int(data, "cards", where),
        time_limit_minutes=minutes,
        budget=budget,
        entrypoint=manifest_text(data, "entrypoint", where),
        directory=directory,
        alternatives=alternatives,
        files=files,
        env=env,
        outputs={str(k): str(v) for k, v in outputs.items()},
        bounds=bounds,
        **slurm,
    )


def _slurm(data: Any, files: tuple[str, ...], where: str) -> dict[str, Any]:
    """The manifest's ``slurm`` run (nodes: 2..MAX_SLURM_NODES; script: one of its ``files``;
    gpu_model; slice_cards: a multiple of 8 holding the nodes; budget), or nothing."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CatalogueError(f"{where}: slurm must give nodes, script, gpu_model and slice_cards")
    nodes = data.get("nodes")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 2 <= nodes <= MAX_SLURM_NODES:
        raise CatalogueError(f"{where}: slurm.nodes must be from 2 to {MAX_SLURM_NODES}")
    script = str(data.get("script") or "")
    if script not in files:
        raise CatalogueError(f"{where}: slurm.script must be one of the recipe's files")
    gpu_model = gpu_code(str(data.get("gpu_model") or ""))
    if not gpu_model:
        raise CatalogueError(f"{where}: slurm.gpu_model must be a known GPU model")
    cards = data.get("slice_cards")
    if isinstance(cards, bool) or not isinstance(cards, int) or cards < nodes * 8 or cards % 8:
        raise CatalogueError(f"{where}: slurm.slice_cards must hold its nodes (8 cards each)")
    budget = str(data.get("budget") or "")
    if budget not in BUDGETS:
        raise CatalogueError(f"{where}: slurm.budget must be one of {sorted(BUDGETS)}")
    return {
        "slurm_nodes": nodes,
        "slurm_script": script,
        "slurm_gpu_model": gpu_model,
        "slurm_slice_cards": cards,
        "slurm_budget": budget,
    }


def _bounds(data: Any, where: str) -> dict[str, tuple[int, int]]:
    """The loader's fixed limits narrowed by the manifest's ``bounds`` (NAME: [least, most])."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise CatalogueError(f"{where}: bounds must map names to [least, most]")
    bounds = dict(PARAMETER_LIMITS)
    for name, pair in data.items():
        if (
            not isinstance(name, str)
            or not ENV_NAME.fullmatch(name)
            or not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
            or pair[0] > pair[1]
        ):
            raise CatalogueError(f"{where}: bounds.{name} must be [least, most], whole numbers")
        low, high = pair
        fixed = PARAMETER_LIMITS.get(name)
        if fixed is not None and (low < fixed[0] or high > fixed[1]):
            raise CatalogueError(
                f"{where}: bounds.{name} [{low}, {high}] goes beyond the loader's fixed limits "
                f"[{fixed[0]}, {fixed[1]}]"
            )
        bounds[name] = (low, high)
    return bounds


def read_recipes(root: Path = RECIPES_DIR) -> list[Recipe]:
    """Every recipe under ``root``, by slug; slugs and demo names are unique."""
    recipes = read_all(root, read_recipe)
    for attr in ("slug", "demo"):
        seen: set[str] = set()
        for recipe in recipes:
            value = getattr(recipe, attr)
            if value in seen:
                raise CatalogueError(f"{root}: two recipes share the {attr} {value!r}")
            seen.add(value)
    return recipes


@lru_cache(maxsize=1)
def _shipped() -> tuple[Recipe, ...]:
    return tuple(read_recipes())


def get_recipe(slug: str) -> Recipe | None:
    return next((r for r in _shipped() if r.slug == slug), None)


def get_demo(demo: str) -> Recipe | None:
    return next((r for r in _shipped() if r.demo == demo), None)


def shipped_recipes() -> list[Recipe]:
    return list(_shipped())
