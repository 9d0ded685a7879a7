from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods

from console.htmx import render_page
from slices import services
from slices.choices import NODE_STATE_BADGES, NodeState
from slices.forms import ORDER_TEMPLATES, OrderPreviewForm
from slices.models import Cluster, Node


@login_required
@require_GET
def instance_list(request: HttpRequest) -> HttpResponse:
    return render(request, "slices/instance_list.html")


@login_required
@require_GET
def instance_new(request: HttpRequest) -> HttpResponse:
    """The order form: choices in the query string, a live placement, quote and mount check."""
    from marketplace import services as marketplace

    data = request.GET.copy()
    asset_ids = [a.strip() for v in data.getlist("assets") for a in v.split(",") if a.strip()]
    preset = ORDER_TEMPLATES.get(data.get("template", ""))
    if preset:
        for key in ("gpu_model", "cards", "image"):
            data.setdefault(key, str(preset[key]))
        if not asset_ids:
            for kind, hub_id in preset["asset_hub_ids"]:
                try:
                    asset_ids.append(str(marketplace.get_asset_by_hub_id(kind, hub_id).public_id))
                except Http404:
                    continue  # an operator unlisted it; the demo still runs without it
    rows = services.availability()
    regions = list(dict.fromkeys((r.region, r.region_name) for r in rows))
    gpu_models = list(dict.fromkeys(r.gpu_model for r in rows))
    images = [(v.slug, str(v)) for image in marketplace.list_images() for v in image.shown_versions]
    if gpu_models:
        data.setdefault("gpu_model", gpu_models[0])
        data.setdefault("cards", "8")
    form = OrderPreviewForm(data, regions=regions, gpu_models=gpu_models, images=images)
    preview = None
    if gpu_models and form.is_valid():
        image = (
            marketplace.get_image_version(form.cleaned_data["image"])
            if form.cleaned_data["image"]
            else None
        )
        preview = services.preview_order(
            request.user,
            gpu_model=form.cleaned_data["gpu_model"],
            cards=form.cleaned_data["cards"],
            region=form.cleaned_data["region"] or None,
            image=image,
            asset_ids=asset_ids,
            disk_gb=form.cleaned_data["disk_gb"] or 0,
        )
    context = {
        "form": form,
        "preview": preview,
        "placement_region": dict(regions).get(preview.placement.region, "")
        if preview and preview.placement
        else "",
        "availability": rows,
        "picker": marketplace.asset_picker(request.user, asset_ids, data.get("asset_q", "")),
    }
    return render_page(request, "slices/instance_new.html", context, "summary")


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Operator pages: log in first; customers are refused (403)."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied
        return view(request, *args, **kwargs)

    return wrapper


# Cell colours of the fabric map (Bootstrap palette); allocated cells take their holder's hue.
STATE_COLOURS = {
    NodeState.READY: "#d1e7dd",
    NodeState.ALLOCATED: "#0d6efd",
    NodeState.DRAINING: "#ffc107",
    NodeState.FAILED: "#dc3545",
    NodeState.MAINTENANCE: "#6c757d",
}


# Holders get well-separated colours (no red, yellow or grey: those mean failed, draining and
# maintenance), in the order they appear on the map; the palette repeats past twelve holders.
HOLDER_PALETTE = (
    "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#393b79", "#637939", "#7b4173", "#3182bd", "#ff7f0e", "#bcbd22",
)  # fmt: skip


@staff_required
@require_GET
def ops_fleet(request: HttpRequest) -> HttpResponse:
    rows = services.availability()
    clusters = list(Cluster.objects.select_related("region", "gpu_model").order_by("position"))
    states: dict[int, Counter] = defaultdict(Counter)
    for cluster_id, state in Node.objects.values_list("cluster_id", "state"):
        states[cluster_id][state] += 1
    by_model: dict[str, dict[str, int]] = defaultdict(lambda: {"total": 0, "used": 0})
    for a in rows:
        by_model[a.gpu_model]["total"] += a.total_gpus
        by_model[a.gpu_model]["used"] += a.used_gpus
    models = [
        {
            "code": code,
            "total": v["total"],
            "used": v["used"],
            "percent": round(100 * v["used"] / v["total"]) if v["total"] else 0,
        }
        for code, v in sorted(by_model.items())
    ]
    cluster_rows = [
        {
            "cluster": c,
            "states": [
                (NodeState(s).label, NODE_STATE_BADGES[NodeState(s)], states[c.pk][s])
                for s in NodeState.values
                if states[c.pk][s]
            ],
        }
        for c in clusters
    ]
    context = {"rows": rows, "models": models, "clusters": cluster_rows}
    return render_page(request, "slices/ops_fleet.html", context, "utilisation")


@staff_required
@require_GET
def ops_cluster(request: HttpRequest, code: str) -> HttpResponse:
    cluster = get_object_or_404(Cluster.objects.select_related("region", "gpu_model"), code=code)
    rows = services.cluster_map(cluster)
    holders: dict[str, dict[str, Any]] = {}
    for row in rows:
        for node in row["nodes"]:
            for a in node.holders:
                colour = HOLDER_PALETTE[len(holders) % len(HOLDER_PALETTE)]
                holders.setdefault(str(a.public_id), {"allocation": a, "colour": colour})
            node.colour = STATE_COLOURS[NodeState(node.state)]
            if node.holders and node.state == NodeState.ALLOCATED:
                node.colour = holders[str(node.holders[0].public_id)]["colour"]
    legend = [(NodeState(s).label, colour) for s, colour in STATE_COLOURS.items()]
    context = {
        "cluster": cluster,
        "rows": rows,
        "legend": legend,
        "holders": list(holders.values()),
        "node_count": sum(len(r["nodes"]) for r in rows),
    }
    return render_page(request, "slices/ops_cluster.html", context, "fabric")


@staff_required
@require_http_methods(["GET", "POST"])
def ops_node(request: HttpRequest, public_id: str) -> HttpResponse:
    node = get_object_or_404(
        Node.objects.select_related("cluster", "su", "gpu_model", "cluster__region"),
        public_id=public_id,
    )
    if request.method == "POST":
        action = request.POST.get("action", "")
        if action not in services.NODE_ACTIONS:
            messages.error(request, _("Unknown action."))
        elif services.change_node_state(node, action, request.POST.get("note", "")[:255]):
            messages.success(
                request,
                _("%(node)s is now %(state)s.") % {"node": node, "state": node.get_state_display()},
            )
        else:
            messages.warning(
                request,
                _("%(node)s did not change: it is %(state)s.")
                % {"node": node, "state": node.get_state_display()},
            )
        if not getattr(request, "htmx", False):
            return redirect("slices:ops-node", public_id=node.public_id)
    gpus = list(node.gpus.select_related("allocation", "allocation__owner").order_by("index"))
    context = {"node": node, "gpus": gpus, "actions": _actions_for(node)}
    return render_page(request, "slices/ops_node.html", context, "node")


def _actions_for(node: Node) -> list[tuple[str, str, str]]:
    empty = node.free_mask == node.full_mask
    out = []
    if node.state in (NodeState.READY, NodeState.ALLOCATED):
        out.append(("drain", _("Drain"), "warning"))
    if empty and node.state != NodeState.MAINTENANCE:
        out.append(("maintenance", _("Maintenance"), "secondary"))
    if node.state != NodeState.FAILED:
        out.append(("fail", _("Mark failed"), "danger"))
    if node.state not in (NodeState.READY, NodeState.ALLOCATED):
        out.append(("return", _("Return to service"), "success"))
    return out
