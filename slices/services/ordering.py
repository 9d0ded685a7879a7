"""Order preview: what an order would get and cost now, before anything is reserved."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.http import Http404
from django.utils import timezone
from django.utils.translation import gettext as _

from billing import services as billing
from billing.choices import BillingMode
from console import services as console_services
from console.tenancy import user_of
from marketplace import recipes
from marketplace import services as marketplace
from slices import topology
from slices.models import Instance
from slices.services.allocation import NoCapacity, Preview, preview_allocation
from slices.services.eta import instance_eta
from slices.services.fleet import Availability, ClusterSize, availability, fleet_view
from slices.services.instances import OrderRequest, check_funds, order_instance, price_name

# ---------------------------------------------------------------------------------------------
# Order preview: what an order would get and cost now, before anything is reserved
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrderPreview:
    """Everything the order form shows before the customer confirms. Nothing is reserved."""

    gpu_model: str
    cards: int
    placement: Preview | None
    no_capacity: NoCapacity | None
    quote: Any  # billing.pricing.Quote, or None when no price is set
    price_error: str
    insufficient_funds: str
    image: Any  # marketplace ImageVersion or None
    image_warning: str
    mounts: list[Any]  # marketplace MountSpec
    mount_error: Any  # marketplace MountRefused or None

    @property
    def queueable(self) -> bool:
        """排队: everything is in order but no cards are free now (an order may queue)."""
        return (
            self.placement is None
            and self.no_capacity is not None
            and self.no_capacity.reason_code == "no_capacity"
            and self.quote is not None
            and not self.insufficient_funds
            and self.mount_error is None
            and not self.image_warning
        )

    @property
    def orderable(self) -> bool:
        return (
            self.placement is not None
            and self.quote is not None
            and not self.insufficient_funds
            and self.mount_error is None
            and not self.image_warning
        )


def resolve_order_template(name: str) -> tuple[dict[str, str], list[str]]:
    """A recipe of the catalogue as the order form's preset (``?template=`` names the recipe, its
    demo page or, as the old dashboard link did, ``<demo>-demo``): its GPU model, cards and image,
    and the public ids of its model and dataset. Unknown name: nothing."""
    recipe = (
        recipes.get_recipe(name)
        or recipes.get_demo(name)
        or recipes.get_demo(name.removesuffix("-demo"))
    )
    if recipe is None:
        return {}, []
    asset_ids = []
    for kind, hub_id in (("model", recipe.model), ("dataset", recipe.dataset)):
        try:
            asset_ids.append(str(marketplace.get_asset_by_hub_id(kind, hub_id).public_id))
        except Http404:
            continue  # an operator unlisted it; the form says what is missing
    fields = {"gpu_model": recipe.gpu_model, "cards": str(recipe.cards), "image": recipe.image}
    return fields, asset_ids


@dataclass(frozen=True)
class OrderChoices:
    """What the order form offers now: regions and GPU models with capacity, listed images; the
    clusters' sizes and the current price list, read once for the form's other choices."""

    availability: list[Availability]
    regions: list[tuple[str, str]]  # (code, display name)
    gpu_models: list[str]
    images: list[tuple[str, str]]  # (version slug, label)
    clusters: tuple[ClusterSize, ...] = ()
    prices: list[tuple[Any, list[Any]]] | None = None  # billing.price_list(); None: not read


def order_choices() -> OrderChoices:
    view = fleet_view()
    rows = availability(view)
    return OrderChoices(
        availability=rows,
        regions=list(dict.fromkeys((r.region, r.region_name) for r in rows)),
        gpu_models=list(dict.fromkeys(r.gpu_model for r in rows)),
        images=[
            (v.slug, str(v))
            for i in marketplace.list_images()
            for v in i.shown_versions  # type: ignore[attr-defined]  # set by list_images()
        ],
        clusters=view.clusters,
        prices=billing.price_list(),
    )


def preview_order(
    user: Any,
    *,
    gpu_model: str,
    cards: int,
    region: str | None = None,
    image: str = "",
    asset_ids: Iterable[str] = (),
    disk_gb: int = 0,
) -> OrderPreview:
    """Place (without reserving), price and check the mounts of an order, through each app's
    services: the allocator here, billing's quote and affordability check, marketplace mounts.
    ``image`` is an image version's slug or public id, or an image family's slug ("" for none)."""
    placement: Preview | None = None
    no_capacity: NoCapacity | None = None
    try:
        placement = preview_allocation(cards, gpu_model, region or None)
    except NoCapacity as exc:
        no_capacity = exc

    # The price book names models by product name ("RTX 4090"), the fleet by code ("RTX4090").
    book_name = price_name(gpu_model)
    quote, price_error, insufficient = None, "", ""
    if book_name is None:
        price_error = _("%(model)s is not available to order yet: no price is set.") % {
            "model": gpu_model
        }
    else:
        try:
            quote, _rate = check_funds(
                user, book_name, OrderRequest(gpu_model=gpu_model, cards=cards)
            )
        except billing.InsufficientFunds as exc:
            insufficient = exc.message()
        if quote is None or disk_gb:
            # The affordability check quotes the cards alone: a disk, or a refusal, asks again.
            quote = billing.quote_for(user, book_name, cards, disk_gb)

    version, image_warning = None, ""
    if image:
        try:  # a version's slug or id, or a family's slug (its newest version for this card)
            version = marketplace.resolve_image_version(image, gpu_model)
        except marketplace.ImageRefused as exc:
            image_warning = exc.message()
    if version is not None and not version.supports(gpu_model):
        image_warning = _("This image is not built for %(model)s.") % {"model": gpu_model}

    mounts: list[Any] = []
    mount_error = None
    try:
        mounts = marketplace.build_mount_specs(user, list(asset_ids))
    except marketplace.MountRefused as exc:
        mount_error = exc
    return OrderPreview(
        gpu_model,
        cards,
        placement,
        no_capacity,
        quote,
        price_error,
        insufficient,
        version,
        image_warning,
        mounts,
        mount_error,
    )


# ---------------------------------------------------------------------------------------------
# The order form's choices and ordering from it
# ---------------------------------------------------------------------------------------------


def priced_models(prices: list[tuple[Any, list[Any]]] | None = None) -> dict[str, Any]:
    """Fleet GPU model code → its GpuPrice, for models with a real (non-placeholder) price
    (``prices``: the price list when already read)."""
    out = {}
    for price, _terms in billing.price_list() if prices is None else prices:
        if getattr(price, "is_placeholder", False):
            continue
        out[billing.gpu_model_key(price.gpu_model)] = price
    return out


def default_order(choices: OrderChoices) -> dict[str, str]:
    """Open the form on a sensible, cheap, available configuration: the cheapest priced model
    that can start a host now, with the smallest host."""
    prices = priced_models(choices.prices)
    best: tuple[Any, str, int] | None = None
    for row in choices.availability:
        price = prices.get(billing.gpu_model_key(row.gpu_model))
        if price is None or not row.host_sizes:
            continue
        key = (price.on_demand_per_card_hour, row.gpu_model, row.host_sizes[0])
        if best is None or key < best:
            best = key
    if best is None:
        return {"gpu_model": choices.gpu_models[0], "cards": "1"} if choices.gpu_models else {}
    return {"gpu_model": best[1], "cards": str(best[2])}


def card_choices(choices: OrderChoices, gpu_model: str, region: str) -> list[tuple[int, str]]:
    """Card counts that can run for this model (and region): hosts up to a node's GPUs, slices
    only where the model has an InfiniBand cluster, up to its size."""
    rows = [
        r
        for r in choices.availability
        if r.gpu_model == gpu_model and (not region or r.region == region)
    ]
    # The clusters' sizes as the fleet view has them (no look-up of its own).
    clusters = [
        c
        for c in choices.clusters or fleet_view().clusters
        if c.gpu_model == gpu_model and (not region or c.region == region)
    ]
    gpn = max((c.gpus_per_node for c in clusters), default=8)
    out = [(n, str(n)) for n in topology.HOST_SIZES if n <= gpn]
    if any(r.slices for r in rows):
        biggest = max((c.gpus for c in clusters if c.slices), default=0)
        out += [
            (n, str(n))
            for n in range(topology.SLICE_UNIT_GPUS, biggest + 1, topology.SLICE_UNIT_GPUS)
        ]
    return out


@dataclass(frozen=True)
class SshKeyChoices:
    choices: list[tuple[str, str]]
    default: str


def ssh_key_choices(user: Any) -> SshKeyChoices:
    keys = list(console_services.ssh_keys_of(user_of(user)).order_by("-is_default", "name"))
    default = next((str(k.public_id) for k in keys if k.is_default), "")
    return SshKeyChoices([(str(k.public_id), k.name) for k in keys], default)


def term_days_for(gpu_model: str, prices: list[tuple[Any, list[Any]]] | None = None) -> list[int]:
    """The term lengths (days) the price list offers for the model (``prices``: the price
    list when already read)."""
    key = billing.gpu_model_key(gpu_model or "")
    return sorted(
        {
            t.days
            for p, terms in (billing.price_list() if prices is None else prices)
            if billing.gpu_model_key(p.gpu_model) == key
            for t in terms
        }
    )


def order_from_forms(
    user: Any,
    preview: dict[str, Any],
    order: dict[str, Any],
    asset_ids: list[str],
    *,
    request: Any = None,
) -> Instance:
    hours = order.get("auto_release_hours")
    req = OrderRequest(
        gpu_model=preview["gpu_model"],
        cards=int(preview["cards"]),
        name=order.get("name") or "",
        region=preview.get("region") or "",
        image=preview.get("image") or "",
        asset_ids=tuple(asset_ids),
        ssh_key=order.get("ssh_key") or "",
        billing_mode=order.get("billing_mode") or BillingMode.ON_DEMAND,
        term_days=order.get("term_days"),
        auto_release_at=timezone.now() + timedelta(hours=float(hours)) if hours else None,
        disks=tuple(
            (str(d), "ro" if order.get("disks_read_only") else "rw")
            for d in order.get("disks") or ()
        ),
        web_ports=tuple(order.get("web_ports") or ()),
        scheduler=order.get("scheduler") or "",
        # 运行作业 (job mode, issue 31): its end releases the slice.
        job={
            "script": order["job_script"],
            "name": "job",
            "nodes": order.get("job_nodes") or max(1, int(preview["cards"]) // 8),
        }
        if (order.get("job_script") or "").strip()
        else None,
        when_unavailable="queue" if order.get("when_unavailable") == "queue" else "",
        max_wait_hours=float(order["queue_max_wait_hours"])
        if order.get("queue_max_wait_hours")
        else None,
    )
    instance, _created = order_instance(user, req, request=request)
    return instance


def provisioning_eta(instance: Instance, steps: list[str | None]) -> int:
    """Seconds until running (``slices.services.eta``: recent orders' timelines, else the
    driver's step model); 0 when the instance is not on its way to running."""
    estimate = instance_eta(instance)
    return estimate.seconds if estimate is not None else 0
