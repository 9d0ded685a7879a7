"""The operator pages: the fleet, a cluster's fabric map, a node, every customer's instances."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods

from console.auth import staff_required
from console.htmx import render_page
from slices import services
from slices.choices import NODE_STATE_BADGES, InstanceState, NodeSignal, NodeState
from slices.messages import failure_text
from slices.models import Cluster, Instance, Node, NodeFailure, NodeWatch

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


# Node failures listed on the operator pages (the fleet's latest, each node's history).
FAILURES_SHOWN = 20


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
    failures = list(
        NodeFailure.objects.select_related("node").order_by("-at", "-id")[:FAILURES_SHOWN]
    )
    context = {"rows": rows, "models": models, "clusters": cluster_rows, "failures": failures}
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
        elif services.change_node_state(
            node, action, request.POST.get("note", "")[:255], who=request.user, request=request
        ):
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
    gpus = list(node.gpus.select_related("allocation", "allocation__team").order_by("index"))
    watch = NodeWatch.objects.filter(node=node).first()
    context = {
        "node": node,
        "gpus": gpus,
        "actions": _actions_for(node),
        "watch": watch,
        "watch_facts": _watch_facts(watch) if watch else [],
        "failures": [
            {"failure": f, "facts": failure_facts(f)} for f in node.failures.all()[:FAILURES_SHOWN]
        ],
    }
    return render_page(request, "slices/ops_node.html", context, "node")


def _heartbeat_source(source: str) -> str:
    return {
        "probe": _("the console's probe"),
        "agent": _("the node's agent"),
        "start": _("a start on the node"),
    }.get(source, source or "—")


def _when(value: Any) -> Any:
    return parse_datetime(value) if isinstance(value, str) else value


def _watch_facts(watch: NodeWatch) -> list[tuple[str, Any]]:
    """What the console knows of a node's health now: its last heartbeat and probe."""
    facts: list[tuple[str, Any]] = [
        (_("Last heartbeat"), watch.last_heartbeat_at or "—"),
        (_("Heartbeat from"), _heartbeat_source(watch.heartbeat_source)),
        (_("Last probe"), watch.last_probe_at or "—"),
        (_("Failed probes in a row"), watch.misses),
    ]
    if watch.probe_error:
        facts.append((_("Probe error"), watch.probe_error))
    if watch.bad_signal:
        facts.append((_("Signal"), f"{NodeSignal(watch.bad_signal).label}: {watch.bad_detail}"))
        facts.append((_("Signal since"), watch.bad_since or "—"))
    return facts


def failure_facts(failure: NodeFailure) -> list[tuple[str, Any]]:
    """The evidence a node failure was judged on, labelled for the operator page."""
    ev = failure.evidence or {}
    if not failure.automatic:
        return [(_("Judged by"), _("an operator"))]
    rules = {
        "signal": _("a bad signal not cleared within the grace"),
        "silence": _("no answer to the console's probes within the grace"),
    }
    facts: list[tuple[str, Any]] = [
        (_("Rule"), rules.get(str(ev.get("rule", "")), str(ev.get("rule", "")))),
    ]
    if ev.get("bad_since"):
        facts.append((_("Signal since"), _when(ev["bad_since"])))
    facts.append((_("Last heartbeat"), _when(ev.get("last_heartbeat_at")) or "—"))
    if ev.get("heartbeat_source"):
        facts.append((_("Heartbeat from"), _heartbeat_source(str(ev["heartbeat_source"]))))
    if ev.get("last_probe_at"):
        facts.append((_("Last probe"), _when(ev["last_probe_at"])))
    if "misses" in ev:
        facts.append((_("Failed probes in a row"), ev["misses"]))
    if ev.get("probe_error"):
        facts.append((_("Probe error"), ev["probe_error"]))
    if "fail_grace_s" in ev:
        facts.append(
            (
                _("Graces"),
                _("signal %(signal)s s, heartbeat %(heartbeat)s s")
                % {"signal": ev["fail_grace_s"], "heartbeat": ev.get("heartbeat_grace_s", "—")},
            )
        )
    facts.append((_("Instances migrated"), ", ".join(ev.get("instances") or []) or "—"))
    return facts


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


@staff_required
@require_GET
def ops_instances(request: HttpRequest) -> HttpResponse:
    """Every customer's instances, failed provisioning first, with its reason."""
    state = request.GET.get("state", "")
    qs = Instance.objects.select_related(
        "team", "created_by", "gpu_model", "region", "allocation__cluster"
    )
    if state in InstanceState.values:
        qs = qs.filter(state=state)
    else:
        qs = qs.exclude(state=InstanceState.RELEASED)
    instances = list(qs.order_by("-created_at")[:300])
    for i in instances:
        i.failure = failure_text(i.failure_code, i.failure_params) if i.failure_code else ""  # type: ignore[attr-defined]
    context = {"instances": instances, "state": state, "states": InstanceState.choices}
    return render(request, "slices/ops_instances.html", context)
