"""The training-progress card of an instance that runs a recipe (``{% recipe_run instance %}``)."""

from __future__ import annotations

from typing import Any

from django import template

from slices.models import Instance
from slices.services import recipes
from slices.services.instances import instance_cost

register = template.Library()


@register.inclusion_tag("slices/_recipe_run.html")
def recipe_run(instance: Instance) -> dict[str, Any]:
    recipe = recipes.recipe_of(instance)
    if recipe is None:
        return {"recipe": None}
    run = recipes.run_progress(instance)
    return {
        "recipe": recipe,
        "instance": instance,
        "run": run,
        "curve": run.curve(320, 80),
        "cost": instance_cost(instance),
        "ended": instance.state in ("released", "releasing", "failed"),
        "demo_url": f"/demo/{recipe.demo}/",
    }


@register.inclusion_tag("slices/_recipe_demo_link.html")
def recipe_demo_link(kind: str, ref: str) -> dict[str, Any]:
    """A link to the demo pages that run this model or dataset (hub id) or image (slug):
    ``{% recipe_demo_link "model" asset.hub_id %}``, ``{% recipe_demo_link "image" image.slug %}``."""
    from marketplace import recipes as catalogue_recipes

    found = []
    for recipe in catalogue_recipes.shipped_recipes():
        if (
            (kind == "model" and recipe.model == ref)
            or (kind == "dataset" and recipe.dataset == ref)
            or (kind == "image" and recipe.image.startswith(f"{ref}-"))
        ):
            found.append(recipe)
    return {"demos": found}
