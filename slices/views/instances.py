"""The instance pages: the list, the order form, an instance's page (progress, events,
storage cards), release, 关机/开机 and the migration choice."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import get_language
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods

from billing.choices import BillingMode
from billing.services import gpu_model_key as billing_key
from console.errors import DomainError, ErrorCode
from console.htmx import render_page, stop_polling
from console.tenancy import acting
from marketplace.services import asset_picker
from slices import lifecycle, services
from slices.choices import EventKind, InstanceState, NoReplacement
from slices.drivers import driver_capabilities
from slices.forms import (
    InstanceListFilter,
    OrderForm,
    OrderPreviewForm,
    filter_instances,
    instance_filter_counts,
)
from slices.hostspec import host_spec
from slices.messages import event_text, failure_text, step_label
from slices.models import Disk, Instance
from slices.services import NoCapacity, apps, migration, power, slurm, storage
from slices.services import disks as disk_service
from slices.services.eta import instance_eta
from slices.services.instances import instance_cost, instance_costs
from slices.services.ordering import priced_models


@login_required
@require_GET
def instance_list(request: HttpRequest) -> HttpResponse:
    """The owner's instances under one ``?state=`` filter (active by default, as the API).

    An unknown ``state`` shows the default view rather than an error page: a hand-edited or
    stale URL in a browser still lands on a working list, with the chosen tab marked. The API,
    read by scripts, refuses it with a 400 instead, so a typo there is not silently widened.
    """
    state = InstanceListFilter(request.GET).chosen() or InstanceListFilter.DEFAULT
    owned = Instance.objects.for_team(acting(request))
    counts = instance_filter_counts(owned)
    instances = list(
        filter_instances(owned, state)
        .select_related("gpu_model", "region")
        .order_by("-created_at")[:INSTANCE_LIST_LIMIT]
    )
    costs = instance_costs(instances)  # one query for the page
    for i in instances:
        i.cost = costs[i.pk]  # type: ignore[attr-defined]
    # Poll while anything of the account is in transition: a row may move between tabs and the
    # tabs' counts change with it, whichever tab is shown.
    busy = counts["busy"] > 0
    context = {
        "instances": instances,
        "busy": busy,
        "state": state,
        "filters": [
            {"value": value, "label": label, "count": counts[value], "current": value == state}
            for value, label in InstanceListFilter.CHOICES
        ],
        "total": counts[state],
        "any_instances": counts[InstanceListFilter.ALL] > 0,
        "limit": INSTANCE_LIST_LIMIT,
    }
    response = render_page(request, "slices/instance_list.html", context, "rows")
    if getattr(request, "htmx", False) and not busy:
        return stop_polling(response)
    return response


# The list page shows the newest this many of a filter (it says so when there are more).
INSTANCE_LIST_LIMIT = 200


TRANSITIONAL_STATES = {s.value for s in lifecycle.TRANSITIONAL}


def _order_context(request: HttpRequest, data: Any) -> dict[str, Any]:
    asset_ids = [a.strip() for v in data.getlist("assets") for a in v.split(",") if a.strip()]
    defaults, preset_assets = services.resolve_order_template(data.get("template", ""))
    asset_ids = asset_ids or preset_assets
    choices = services.order_choices()
    for key, value in {**services.default_order(choices), **defaults}.items():
        data.setdefault(key, value)
    # Only models that have a cluster in the chosen region (a combination that cannot run is
    # not offered; a shared URL with one gets the allocator's reason instead).
    region = data.get("region", "")
    models = [
        m
        for m in choices.gpu_models
        if not region or any(r.gpu_model == m and r.region == region for r in choices.availability)
    ]
    if data.get("gpu_model") in choices.gpu_models and data["gpu_model"] not in models:
        models.append(data["gpu_model"])  # from a shared URL: the allocator says why not here
    # A model the fleet has but nobody can order yet (no published price) is listed as such,
    # never as available (issue 29); default_order never opens the form on one.
    priced = priced_models(choices.prices)
    unorderable = {m for m in models if billing_key(m) not in priced}
    form = OrderPreviewForm(
        data,
        regions=choices.regions,
        gpu_models=models,
        unorderable=unorderable,
        images=choices.images,
        cards=services.card_choices(choices, data.get("gpu_model", ""), data.get("region", "")),
    )
    keys = services.ssh_key_choices(acting(request))
    if "ssh_key" not in data and keys.default:
        data["ssh_key"] = keys.default
    data.setdefault("billing_mode", BillingMode.ON_DEMAND)
    own_disks = list(Disk.objects.for_team(acting(request)).live().select_related("region"))
    order_form = OrderForm(
        data,
        ssh_keys=keys.choices,
        terms=services.term_days_for(data.get("gpu_model", ""), choices.prices),
        disks=[
            (str(d.public_id), f"{d.name} · {d.size_gb} GB · {d.region.display_name}")
            for d in own_disks
        ],
    )
    picked_disks = set(data.getlist("disks")) if hasattr(data, "getlist") else set()
    preview = None
    if choices.gpu_models and form.is_valid():
        preview = services.preview_order(
            acting(request),
            gpu_model=form.cleaned_data["gpu_model"],
            cards=form.cleaned_data["cards"],
            region=form.cleaned_data["region"] or None,
            image=form.cleaned_data["image"],
            asset_ids=asset_ids,
            disk_gb=form.cleaned_data["disk_gb"] or 0,
        )
    return {
        "form": form,
        "order_form": order_form,
        "asset_ids": asset_ids,
        "preview": preview,
        "placement_region": dict(choices.regions).get(preview.placement.region, "")
        if preview and preview.placement
        else "",
        "availability": choices.availability,
        "min_runway_hours": Decimal(services.min_runway_seconds()) / 3600,
        # What each orderable GPU model's card comes with, and the chosen order's totals.
        "offer_specs": [(m, host_spec(m)) for m in choices.gpu_models if m not in unorderable],
        "unorderable": unorderable,
        "host": host_spec(preview.gpu_model) if preview else None,
        "system_disk_gb": settings.SLICES_SYSTEM_DISK_GB,
        # The data disks are the cloud disks the order attaches (the form's "disks").
        "data_disks": [d for d in own_disks if str(d.public_id) in picked_disks],
    }


@login_required
@require_http_methods(["GET", "POST"])
def instance_new(request: HttpRequest) -> HttpResponse:
    """The order form: choices in the query string, a live placement, quote and mount check;
    posting it orders (nothing is reserved before)."""
    if request.method == "GET" and "csrfmiddlewaretoken" in request.GET:
        # The whole order form sent as a GET (a browser without JavaScript pressed "Update the
        # quote"): the same choices at an address without the CSRF token, so the token stays in
        # no history, log or Referer beyond this one request (issue 29).
        query = request.GET.copy()
        query.pop("csrfmiddlewaretoken")
        return redirect(f"{request.path}?{query.urlencode()}")
    data = (request.POST if request.method == "POST" else request.GET).copy()
    context = _order_context(request, data)
    if request.method == "POST":
        form, order_form = context["form"], context["order_form"]
        if form.is_valid() and order_form.is_valid():
            try:
                instance = services.order_from_forms(
                    acting(request),
                    form.cleaned_data,
                    order_form.cleaned_data,
                    context["asset_ids"],
                    request=request,
                )
            except (DomainError, NoCapacity) as exc:
                context["order_error"] = exc
            else:
                messages.success(
                    request,
                    _("Ordered %(name)s: it is being provisioned.") % {"name": instance.name},
                )
                return redirect("slices:instance-detail", public_id=instance.public_id)
    context["picker"] = asset_picker(acting(request), context["asset_ids"], data.get("asset_q", ""))
    status = 409 if context.get("order_error") is not None else 200
    if getattr(context.get("order_error"), "code", None) == ErrorCode.VERIFICATION_REQUIRED:
        status = 403  # 实名认证 first: refused as the API refuses
    return render_page(request, "slices/instance_new.html", context, "summary", status=status)


HIDDEN_KEY = "••••••••"


@login_required
@require_GET
def instance_detail(request: HttpRequest, public_id: str) -> HttpResponse:
    instance = services.get_instance_for_user(acting(request), public_id)
    # htmx asks for one region: the live overview (default) or the event list (?part=events).
    asked = request.GET.get("part")
    part = asked if asked in ("events", "running") else "live"
    context = _detail_context(instance)
    status_ = context["app_status"]
    if status_ is not None and status_.api_key and not acting(request).may_operate(instance):
        # An AI app's key opens its API: for its maker and the team's admins, not every member.
        context["app_status"] = status_ = replace(status_, api_key=HIDDEN_KEY)
    if status_ is not None and status_.api_path:
        context["api_base_url"] = request.build_absolute_uri(status_.api_path)
    return render_page(request, "slices/instance_detail.html", context, part)


def _software(instance: Instance) -> dict[str, Any]:
    """What the instance runs and reads: its image version and container, and its read-only
    mounts by kind (models, datasets), each with its catalogue page (read from the instance's
    own fields, no query: the order wrote them)."""
    mounted: dict[str, list[dict[str, str]]] = {"model": [], "dataset": []}
    for m in instance.mounts or []:
        kind = str(m.get("kind") or "")
        if kind not in mounted:
            continue
        slug = str(m.get("slug") or "")
        mounted[kind].append(
            {
                "hub_id": str(m.get("hub_id") or slug),
                "target": str(m.get("target") or ""),
                "url": reverse(f"marketplace:{kind}-detail", args=[slug]) if slug else "",
            }
        )
    return {
        "image": instance.image,
        "container": instance.container,
        "models": mounted["model"],
        "datasets": mounted["dataset"],
    }


def _queue_estimate(instance: Instance) -> dict[str, Any] | None:
    """排队: the stored start estimate with its times as datetimes (None unless queued)."""
    if instance.state != InstanceState.QUEUED:
        return None
    e = instance.start_estimate or {}

    def at(key: str) -> datetime | None:
        value = e.get(key)
        return datetime.fromisoformat(value) if value else None

    return {
        "p50": at("p50"),
        "p90": at("p90"),
        "position": e.get("position"),
        "updated_at": at("updated_at"),
        "deadline": instance.queue_deadline,
    }


def _detail_context(instance: Instance) -> dict[str, Any]:
    nodes = list(instance.nodes.order_by("rank"))
    provisioning = instance.state == InstanceState.PROVISIONING
    for n in nodes:
        n.progress = lifecycle.node_progress(n.step or None)  # type: ignore[attr-defined]
        # While provisioning, a node shows the step under way ("Mounting storage…"), not the
        # one it last finished; a node that is done shows "Ready".
        under_way = lifecycle.next_step(n.step or None) if provisioning and not n.failed else None
        n.step_label = (  # type: ignore[attr-defined]
            _("%(step)s…") % {"step": step_label(under_way)}
            if under_way is not None and under_way != lifecycle.Step.READY
            else step_label(n.step)
            if n.step
            else ""
        )
    events_qs = instance.events.order_by("-id")
    # Read only by the part rendered (the template calls them): the live region, re-fetched on
    # every change, needs neither. A multi-node instance's step events are folded per step.
    fold_nodes = len(nodes) if len(nodes) > 1 else 0

    def state_events() -> list[Any]:
        return _shown_events(instance, fold_nodes)

    def log_events() -> list[Any]:
        return list(events_qs.filter(kind=EventKind.LOG)[:500])[::-1]

    estimate = instance_eta(instance, nodes)
    # "Elapsed" is the time it has run (billed from running), or since the order until then.
    since = instance.running_at or instance.created_at
    return {
        "instance": instance,
        "queue_estimate": _queue_estimate(instance),
        "software": _software(instance),
        "nodes": nodes,
        "progress": lifecycle.instance_progress([n.step or None for n in nodes]),
        **_node_overview(nodes, provisioning),
        "events": state_events,
        "logs": log_events,
        "last_event_id": events_qs.values_list("id", flat=True).first() or 0,
        "cost": instance_cost(instance),
        "eta_seconds": estimate.seconds if estimate else None,
        "current_step": step_label(estimate.current_step)
        if estimate and estimate.current_step
        else "",
        "failure": failure_text(instance.failure_code, instance.failure_params)
        if instance.failure_code
        else "",
        "elapsed": int(((instance.ended_at or timezone.now()) - since).total_seconds()),
        "elapsed_running": instance.running_at is not None,
        "transitional": instance.state in TRANSITIONAL_STATES,
        "simulated": driver_capabilities(instance.driver or None).simulated,
        "has_slurm": slurm.cluster_of(instance) is not None,  # the Jobs tab (issue 31)
        "app_status": (app_status := apps.app_status(instance)),
        "app_name": app_status.app.localized_name(get_language() or "zh-hans")
        if app_status
        else "",
        **_storage_context(instance),
    }


# A multi-node instance's page groups provisioning by step and folds the per-node rows: they come
# with the page up to this many nodes; beyond, only when the reader opens them (``?nodes=1``).
NODES_INLINE_MAX = 32
# The newest events the Events tab shows (besides the folded step events).
EVENTS_SHOWN = 200
# The newest step events read for the folded groups: 256 nodes × 6 steps is 1,536 per provisioning.
STEP_EVENTS_MAX = 4000
# A folded step of a big instance lists its slowest nodes, not all of them.
FOLDED_NODES_SHOWN = 8


@dataclass(frozen=True)
class StepRow:
    """One provisioning step across an instance's nodes ("Isolate on the fabric 16/16 done")."""

    step: str
    label: str
    done: int  # nodes past this step
    under_way: int  # nodes on it now (while provisioning)
    failed: int  # nodes that failed on it
    total: int

    @property
    def status(self) -> str:
        if self.failed:
            return "failed"
        if self.done >= self.total:
            return "done"
        return "running" if self.under_way else "waiting"

    @property
    def percent(self) -> int:
        return round(100 * self.done / self.total) if self.total else 0


def _node_overview(nodes: list[Any], provisioning: bool) -> dict[str, Any]:
    """The progress card's grouped view of a multi-node instance: one row per step with how many
    nodes passed it, the node furthest behind, the failed ones (all from the rows already read).

    The slowest node is the one on the earliest step; among those on the same step, the one that
    has been on it longest (its ``step_started_at`` is when its previous step ended)."""
    order = {s.value: i for i, s in enumerate(lifecycle.STEPS)}
    reached = [order.get(n.step, -1) for n in nodes]
    rows = []
    for i, step in enumerate(lifecycle.STEPS):
        if step == lifecycle.Step.READY:  # not a step: the state after the last
            continue
        on_it = [n for n, r in zip(nodes, reached, strict=True) if r == i - 1]
        failed = sum(1 for n in on_it if n.failed)
        rows.append(
            StepRow(
                step=step.value,
                label=step_label(step),
                done=sum(1 for r in reached if r >= i),
                under_way=len(on_it) - failed if provisioning else 0,
                failed=failed,
                total=len(nodes),
            )
        )
    failed_nodes = [n for n in nodes if n.failed]
    for n in failed_nodes:
        on = lifecycle.next_step(n.step or None)
        n.failed_on = step_label(on) if on else ""  # type: ignore[attr-defined]
    behind = [n for n in nodes if not n.failed and n.step != lifecycle.Step.READY]
    slowest = (
        min(
            behind,
            key=lambda n: (
                order.get(n.step, -1),
                n.step_started_at.timestamp() if n.step_started_at else 0.0,
                n.rank,
            ),
        )
        if provisioning and behind and len(nodes) > 1
        else None
    )
    return {
        "node_steps": rows,
        "slowest_node": slowest,
        "failed_nodes": failed_nodes,
        "nodes_ready": sum(1 for n in nodes if n.step == lifecycle.Step.READY and not n.failed),
        "nodes_grouped": len(nodes) > 1,
        "nodes_inline": len(nodes) <= NODES_INLINE_MAX,
    }


class StepEventGroup:
    """One step's ``step_done`` events across a multi-node instance, shown as one folded line.

    ``key`` is the first event's id: the group keeps it while it grows, so the page can keep the
    reader's fold open across live refreshes. A node seen again (a restart, a migration's
    replacement) starts a new group: each provisioning round is counted on its own."""

    fold = True

    def __init__(self, key: int, step: str, total: int) -> None:
        self.key, self.step, self.total = key, step, total
        self.done: list[tuple[Any, str]] = []  # (at, node) in the order they finished
        self.nodes: set[str] = set()
        self.last_id = key

    def add(self, pk: int, at: Any, node: str) -> None:
        self.done.append((at, node))
        self.nodes.add(node)
        self.last_id = pk

    @property
    def first_at(self) -> Any:
        return self.done[0][0] if self.done else None

    @property
    def last_at(self) -> Any:
        return self.done[-1][0] if self.done else None

    @property
    def count(self) -> int:
        return len(self.done)

    @property
    def label(self) -> str:
        return step_label(self.step)

    @property
    def message(self) -> str:
        return _("%(step)s done on %(done)s of %(total)s nodes") % {
            "step": self.label,
            "done": self.count,
            "total": max(self.total, self.count),
        }

    @property
    def slowest(self) -> str:
        return self.done[-1][1] if self.done else ""

    @property
    def shown(self) -> list[tuple[Any, str]]:
        """Every node for a small instance, in the order they finished; a big one's slowest."""
        done = self.done
        return done if len(done) <= NODES_INLINE_MAX else done[-FOLDED_NODES_SHOWN:]

    @property
    def more(self) -> int:
        return self.count - len(self.shown)


def _shown_events(instance: Instance, fold_nodes: int) -> list[Any]:
    """The Events tab's entries, oldest first: the newest ``EVENTS_SHOWN`` state changes, steps
    and errors with their message in the reader's language. With ``fold_nodes`` (the instance's
    node count, 0 for one node) each step's ``step_done`` events become one group, placed where
    its first event was; retries and failures stay lines of their own."""
    events_qs = instance.events.order_by("-id").exclude(kind=EventKind.LOG)
    if fold_nodes:
        events_qs = events_qs.exclude(kind=EventKind.STEP, code="step_done")
    shown: list[Any] = list(events_qs[:EVENTS_SHOWN])[::-1]
    for e in shown:
        e.message = event_text(e.code, e.params) if e.code else e.text
    if not fold_nodes:
        return shown
    # Step events older than the oldest line shown are out of the window too.
    floor = shown[0].pk if len(shown) >= EVENTS_SHOWN else 0
    rows = list(
        instance.events.filter(kind=EventKind.STEP, code="step_done", pk__gt=floor)
        .order_by("-id")
        .values_list("id", "at", "step", "node")[:STEP_EVENTS_MAX]
    )[::-1]
    groups: list[StepEventGroup] = []
    open_groups: dict[str, StepEventGroup] = {}
    for pk, at, step, node in rows:
        group = open_groups.get(step)
        if group is None or node in group.nodes:
            group = StepEventGroup(key=pk, step=step, total=fold_nodes)
            open_groups[step] = group
            groups.append(group)
        group.add(pk, at, node)
    return sorted([*shown, *groups], key=lambda e: e.key if isinstance(e, StepEventGroup) else e.pk)


@login_required
@require_http_methods(["GET", "POST"])
def instance_release(request: HttpRequest, public_id: str) -> HttpResponse:
    """GET asks for confirmation (the page works without JavaScript); POST releases."""
    instance = services.get_instance_for_user(acting(request), public_id)
    if request.method == "POST":
        if services.release_instance(
            instance, by=request.user.get_username(), who=acting(request), request=request
        ):
            messages.success(
                request, _("Releasing %(name)s. Billing stopped now.") % {"name": instance.name}
            )
        else:
            messages.info(
                request, _("%(name)s is already being released.") % {"name": instance.name}
            )
        if request.POST.get("next") == "list":
            return redirect("slices:instance-list")
        return redirect("slices:instance-detail", public_id=instance.public_id)
    return render(request, "slices/instance_release.html", {"instance": instance})


# ---------------------------------------------------------------------------------------------
# Storage and resilience on the instance page: its storage cards, 关机/开机, migration choices
# ---------------------------------------------------------------------------------------------


# States in which an instance started without GPUs runs that way (a stop clears ``gpuless``).
GPULESS_STATES = (InstanceState.PROVISIONING, InstanceState.RUNNING, InstanceState.STOPPING)


@dataclass(frozen=True)
class SystemDiskCharge:
    """What the instance's system disk costs while it is billed as storage (stopped, or in
    无卡模式): the account's storage charge with it minus without it, so the account's free
    allowance (the price book's ``storage_free_gb``, shared with its cloud disks) is counted once."""

    gb: int
    per_day: Decimal
    free_gb: int
    within_free: bool  # the account's storage, this disk included, fits in the free allowance


def _system_disk_charge(instance: Instance) -> SystemDiskCharge:
    """The system disk's daily storage charge, whether or not storage already counts it.

    ``disk_service.storage_gb`` counts a stopped instance's disk and a 无卡模式 one's; a running
    instance's is added as if stopped (what a stop would add). Counting it once either way keeps
    the figure right for a 无卡模式 instance, which is stoppable and whose disk is already billed.
    """
    disks, system = disk_service.storage_gb(instance.team)
    price = disk_service.storage_price()
    gb = instance.system_disk_gb
    total = disks + system + (0 if disk_service.disk_counted(instance) else gb)
    return SystemDiskCharge(
        gb, price.added_per_day(total, gb), price.free_gb, price.within_free(total)
    )


def _storage_context(instance: Instance) -> dict[str, Any]:
    """The instance page's storage cards: disks, /pfs, the kept system disk, the checkpoint."""
    if instance.state in (InstanceState.RUNNING, InstanceState.MIGRATING, InstanceState.STOPPED):
        storage.refresh_checkpoint(instance)
    disk = _system_disk_charge(instance)
    return {
        "disk_attachments": disk_service.instance_disks(instance),
        "pfs": storage.pfs_summary(instance.team),
        "stop_per_day": disk.per_day,
        "system_disk": disk,
        # 无卡模式 now (placed or running without cards): no GPU charge, only the disk's storage.
        "gpuless": instance.gpuless and instance.state in GPULESS_STATES,
        "stoppable": instance.state in lifecycle.STOPPABLE
        and not instance.is_slice
        and instance.billing_mode == BillingMode.ON_DEMAND,
        "stopped_release_at": power.release_at(instance),
        "checkpoint_dir": storage.checkpoint_env(instance)["CHECKPOINT_DIR"],
        "checkpoint_at": parse_datetime(str((instance.checkpoint or {}).get("at") or "")),
    }


def _flash_error(request: HttpRequest, exc: DomainError) -> None:
    messages.error(request, exc.message())


@login_required
@require_http_methods(["POST"])
def instance_stop(request: HttpRequest, public_id: str) -> HttpResponse:
    """关机: the GPUs are freed and their charge stops; the system disk is kept (storage)."""
    instance = services.get_instance_for_user(acting(request), public_id)
    try:
        disk = _system_disk_charge(instance)
        if power.stop_instance(
            instance, by=request.user.get_username(), who=acting(request), request=request
        ):
            if disk.within_free:
                text = _(
                    "Stopping %(name)s: the GPU charge stopped; its %(gb)s GB system disk is kept "
                    "within your free storage allowance (%(free)s GB): no charge while stopped."
                ) % {"name": instance.name, "gb": disk.gb, "free": disk.free_gb}
            else:
                text = _(
                    "Stopping %(name)s: the GPU charge stopped; its system disk is kept for "
                    "%(per_day)s 元 a day."
                ) % {"name": instance.name, "per_day": disk.per_day}
            messages.success(request, text)
    except DomainError as exc:
        _flash_error(request, exc)
    return redirect("slices:instance-detail", public_id=instance.public_id)


@login_required
@require_http_methods(["POST"])
def instance_start(request: HttpRequest, public_id: str) -> HttpResponse:
    """开机: same host first, else another host in the region, or 无卡模式 when asked."""
    instance = services.get_instance_for_user(acting(request), public_id)
    mode = request.POST.get("mode", power.StartMode.AUTO)
    if mode not in power.StartMode.__members__.values():
        mode = power.StartMode.AUTO
    try:
        result = power.start_instance(
            instance,
            by=request.user.get_username(),
            mode=mode,
            who=acting(request),
            request=request,
        )
    except DomainError as exc:
        _flash_error(request, exc)
        if isinstance(exc, NoCapacity):
            messages.info(
                request,
                _(
                    "No cards are free for it right now. You can start it without GPUs to reach your data."
                ),
            )
    else:
        if result.gpuless:
            text = _("Starting %(name)s without GPUs on %(node)s.")
        elif result.moved_from:
            text = _("Starting %(name)s on %(node)s: its system disk is copied there first.")
        else:
            text = _("Starting %(name)s on %(node)s.")
        messages.success(request, text % {"name": instance.name, "node": result.node})
    return redirect("slices:instance-detail", public_id=instance.public_id)


@login_required
@require_http_methods(["POST"])
def instance_migration_choice(request: HttpRequest, public_id: str) -> HttpResponse:
    """While no replacement node is free: keep waiting, or release the instance."""
    instance = services.get_instance_for_user(acting(request), public_id)
    choice = request.POST.get("choice", "")
    if choice in NoReplacement.values:
        migration.set_no_replacement_choice(instance, choice)
    return redirect("slices:instance-detail", public_id=instance.public_id)
