"""The one-click demo: a recipe of the catalogue on a page of its own."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from console.errors import DomainError
from console.ids import parse_uuid
from console.tenancy import acting
from marketplace import recipes as catalogue_recipes
from slices.models import Instance
from slices.services import NoCapacity, recipes
from slices.services.instances import instance_costs


@login_required
@require_http_methods(["GET", "POST"])
def demo(request: HttpRequest, name: str) -> HttpResponse:
    """What the demo runs, for how long, the most it can cost (from the price book), what the user
    gets, the licence of the weights to accept here, and one launch button."""
    recipe = catalogue_recipes.get_demo(name)
    if recipe is None:
        raise Http404
    error: Any = None
    # The recipe's multi-node Slurm run (issue 31), offered beside the one-node run.
    on_slurm = recipe.on_slurm() if recipe.offers_slurm else None
    if request.method == "POST":
        key = parse_uuid(request.POST.get("launch_key", ""))
        chosen = on_slurm if on_slurm and request.POST.get("mode") == "slurm" else recipe
        try:
            instance = recipes.launch_recipe(
                acting(request),
                chosen,
                accept_license=request.POST.get("accept_license") == "on",
                gpu_model=request.POST.get("gpu_model") or None,
                # One run per rendering of the page: a double click launches once.
                idempotency_key=f"demo:{key}" if key else None,
                request=request,
            )
        except recipes.DemoRunLive as exc:
            # One demo run per account at a time: open the live one and say why.
            messages.info(request, exc.message())
            return redirect("slices:instance-detail", public_id=exc.live.public_id)
        except (DomainError, NoCapacity) as exc:
            error = exc
        else:
            # No flash message: the instance page says "starting" inside its live region, which
            # drops it once the run has started or ended (a flash would stay until a reload).
            return redirect("slices:instance-detail", public_id=instance.public_id)
    offer = recipes.demo_offer(acting(request), recipe)
    slurm_offer = recipes.demo_offer(acting(request), on_slurm) if on_slurm else None
    runs = list(
        Instance.objects.for_team(acting(request))
        .filter(env__RECIPE=recipe.slug)
        .select_related("gpu_model")
        .order_by("-created_at")[:5]
    )
    costs = instance_costs(runs)
    for run in runs:
        run.cost = costs[run.pk]  # type: ignore[attr-defined]
        run.progress = recipes.run_progress(run)  # type: ignore[attr-defined]
    context = {
        "recipe": recipe,
        "offer": offer,
        "error": error,
        "runs": runs,
        "recipe_name": recipe.localized_name(request.LANGUAGE_CODE),
        "recipe_summary": recipe.localized_summary(request.LANGUAGE_CODE),
        "adapter_path": "/pfs/" + recipe.adapter_path("<run>"),
        "checkpoint_path": "/pfs/" + recipe.checkpoint_path("<run>", 0).replace("step-0", "step-N"),
        "minutes": offer.choice.time_limit_s // 60 if offer.choice else recipe.time_limit_minutes,
        "launch_key": uuid.uuid4(),
        "slurm_recipe": on_slurm,
        "slurm_offer": slurm_offer,
        "slurm_minutes": slurm_offer.choice.time_limit_s // 60
        if slurm_offer and slurm_offer.choice
        else 0,
    }
    return render(request, "slices/demo.html", context, status=409 if error else 200)
