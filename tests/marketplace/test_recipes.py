"""Recipes of the catalogue (pure: the files, no database): the shipped LLaMA-7B LoRA demo and the
loader's refusals."""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from marketplace import catalogue, recipes
from marketplace.catalogue import DATASET, MODEL, CatalogueError

SHIPPED = recipes.RECIPES_DIR / "llama-lora"


def test_the_llama_demo_is_catalogue_data_naming_an_image_a_model_and_a_dataset_of_the_catalogue() -> (
    None
):
    recipe = recipes.get_demo("llama-7b")
    assert recipe is not None and recipe.slug == "llama-lora"
    assert recipes.get_recipe("llama-lora") == recipe
    assert (recipe.gpu_model, recipe.cards) == ("RTX4090", 8)
    assert recipe.budget == "trial_credit" and recipe.time_limit_minutes == 30
    versions = {v.slug: v for i in catalogue.read_images() for v in i.versions}
    assert recipe.image in versions
    assert recipe.gpu_model in {catalogue.gpu_code(g) for g in versions[recipe.image].gpus}
    models = {r.hub_id: r for r in catalogue.read_catalogue(MODEL)}
    datasets = {r.hub_id for r in catalogue.read_catalogue(DATASET)}
    assert recipe.model == "meta-llama/Llama-2-7b-hf" and models[recipe.model].license == "llama2"
    assert recipe.dataset in datasets
    # The entrypoint launches the recipe's own script with torchrun, one process per GPU.
    assert recipe.entrypoint.startswith("torchrun ")
    assert "--nproc_per_node ${NPROC_PER_NODE:-8}" in recipe.entrypoint
    assert "/train.py" in recipe.entrypoint
    assert recipe.checkpoint_path("demo-1", 50) == "checkpoints/demo-1/step-50"
    assert recipe.adapter_path("demo-1") == "adapters/demo-1"
    assert recipe.localized_name("zh-hans") == "LLaMA-7B LoRA 微调"
    assert recipe.localized_name("en") == "LoRA fine-tuning of LLaMA-7B"


def test_the_recipe_script_is_real_and_needs_only_what_requirements_pins() -> None:
    """train.py imports peft and transformers (from the image, not the console's environment)."""
    tree = ast.parse((SHIPPED / "train.py").read_text())
    imported = {
        (n.module or "").split(".")[0] if isinstance(n, ast.ImportFrom) else a.name.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in (n.names if isinstance(n, ast.Import) else [n])
    }
    pinned = {
        line.split("==")[0]
        for line in (SHIPPED / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    third_party = {name for name in imported if name not in sys.stdlib_module_names}
    assert third_party == {"torch", "peft", "transformers", "safetensors"}
    assert third_party <= pinned
    assert all(
        "==" in line
        for line in (SHIPPED / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )


def _copy(tmp_path: Path, **changes: object) -> Path:
    root = tmp_path / "recipes"
    target = root / "llama-lora"
    shutil.copytree(SHIPPED, target)
    data = yaml.safe_load((target / "manifest.yaml").read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    (target / "manifest.yaml").write_text(yaml.safe_dump(data, allow_unicode=True))
    return root


def test_a_copy_of_the_shipped_recipe_loads() -> None:
    assert [r.slug for r in recipes.read_recipes()] == ["llama-lora"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"slug": "other"}, "name its directory"),
        ({"model": "../etc/passwd"}, "not a hub id"),
        ({"dataset": None}, "dataset is missing"),
        ({"cards": 0}, "positive whole number"),
        ({"cards": "8"}, "positive whole number"),
        ({"time_limit_minutes": 100000}, "time_limit_minutes above"),
        ({"gpu_model": "GTX 1080"}, "known GPU models"),
        ({"budget": "unlimited"}, "budget must be"),
        ({"files": ["../../secrets"]}, "not in the recipe's directory"),
        ({"env": {"lower": "x"}}, "is not NAME: value"),
        # The one manifest loader (marketplace.manifests) holds recipes to the apps' env rule.
        ({"env": {"MAX_STEPS": "1000\nEXTRA=1"}}, "env MAX_STEPS must be one line"),
        ({"outputs": {"checkpoints": "/etc/{run}", "adapter": "a/{run}"}}, "inside /pfs"),
        ({"outputs": {"adapter": "a/{run}"}}, "needs checkpoints and adapter"),
    ],
)
def test_the_loader_refuses_a_manifest_it_cannot_use(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    root = _copy(tmp_path, **changes)
    with pytest.raises(CatalogueError, match=message):
        recipes.read_recipes(root)


def test_two_recipes_cannot_share_a_demo_page(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    twin = root / "llama-lora-2"
    shutil.copytree(root / "llama-lora", twin)
    data = yaml.safe_load((twin / "manifest.yaml").read_text())
    data["slug"] = "llama-lora-2"
    (twin / "manifest.yaml").write_text(yaml.safe_dump(data, allow_unicode=True))
    with pytest.raises(CatalogueError, match="share the demo"):
        recipes.read_recipes(root)
