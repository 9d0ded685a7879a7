"""The training-progress card of an instance that runs a recipe (``{% recipe_run instance %}``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import template
from django.urls import reverse
from django.utils.dateparse import parse_datetime

from slices import progress
from slices.models import Instance
from slices.services import recipes
from slices.services.instances import instance_cost

register = template.Library()

ENDED_STATES = ("released", "releasing", "failed")


def _progress(instance: Instance) -> progress.RunProgress:
    """The run's progress, read once per rendering (the checkpoint card and the training card
    both show it)."""
    cached = getattr(instance, "_recipe_progress", None)
    if cached is None:
        cached = recipes.run_progress(instance)
        instance._recipe_progress = cached  # type: ignore[attr-defined]
    return cached


@register.filter
def pfs_browse_url(pfs_path: str) -> str:
    """``/pfs/adapters/<run>`` (as a job sees it) as its page in the /pfs file browser; "" for
    anything not under /pfs."""
    text = str(pfs_path or "")
    if text.rstrip("/") == "/pfs":
        return reverse("slices:pfs-browse")
    if not text.startswith("/pfs/"):
        return ""
    return f"{reverse('slices:pfs-browse')}?{urlencode({'path': text[len('/pfs/') :].strip('/')})}"


@register.simple_tag
def shown_checkpoint(instance: Instance) -> dict[str, Any] | None:
    """The instance page's "Latest checkpoint": the one found on the PFS (``instance.checkpoint``)
    or, when its recipe has since reported a later one (or the console cannot see the PFS), the
    recipe's: the card and the training card never disagree."""
    stored = instance.checkpoint or {}
    shown: dict[str, Any] | None = None
    if stored.get("step") is not None:
        shown = {
            "step": int(stored["step"]),
            "path": str(stored.get("path") or ""),
            "at": parse_datetime(str(stored.get("at") or "")),
        }
    if (instance.env or {}).get(recipes.RECIPE_ENV):
        reported = _progress(instance).checkpoints
        if reported:
            step, path = max(reported)
            if shown is None or step > shown["step"]:
                shown = {"step": step, "path": path, "at": None}
    return shown


@register.inclusion_tag("slices/_recipe_run.html")
def recipe_run(instance: Instance) -> dict[str, Any]:
    recipe = recipes.recipe_of(instance)
    if recipe is None:
        return {"recipe": None}
    run = _progress(instance)
    return {
        "recipe": recipe,
        "instance": instance,
        "run": run,
        "curve": run.curve(320, 80),
        "cost": instance_cost(instance),
        "ended": instance.state in ENDED_STATES,
        "demo_url": f"/demo/{recipe.demo}/",
        # After the run the instance is gone: its adapter (or, without one, its checkpoints) is
        # fetched from the /pfs file browser, not over SSH.
        "adapter_url": pfs_browse_url(run.adapter),
        "checkpoints_url": pfs_browse_url(run.last_checkpoint.rpartition("/")[0])
        if run.last_checkpoint
        else "",
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
