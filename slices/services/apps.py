"""AI applications (issue 20): an app of the catalogue offered, launched as an instance, watched
until it answers, and its API opened with the instance's own key.

- ``app_offer``: what the app's page shows, priced on the current price book: each GPU model the
  app runs on with its cards (least, preset, most), the price per hour and how long the trial
  credit (and the account's balance) lasts at it, whether the cards are free now, the models to
  choose from and the licence of the chosen one.
- ``launch_app``: accept the licence (when the page's checkbox says so) and order through
  ``order_instance`` like any instance: the app's image, its model (and dataset) mounted
  read-only, its start command, its ports; the instance remembers the app, the model and a key
  of its own for the app's API. Stopping, releasing, idle detection and billing are any
  instance's.
- ``follow_app``: once the instance runs, ask the app's health check through the driver's tunnel
  (the same way the port proxy reaches the node) until it answers, then record when; the page
  shows "starting the app" with the check's progress until then.
- ``resolve_api_access``: the API base URL (``/apps/<instance>/v1/``) takes the app's key as a
  bearer token, checked here before anything reaches the node.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import Http404
from django.utils import timezone
from django.utils.translation import gettext_noop

from billing import services as billing
from billing.money import charge_for
from console.tenancy import team_of
from marketplace import aiapps
from marketplace import services as marketplace
from marketplace.aiapps import AiApp, GpuOption
from marketplace.catalogue import GPU_LABELS
from slices import events
from slices.choices import EventKind, EventLevel, InstanceState
from slices.drivers import DriverError, capabilities, get_driver
from slices.errors import OrderRefused
from slices.models import Instance
from slices.services import jobs, ports, proxy
from slices.services.allocation import NoCapacity, preview_allocation
from slices.services.history import record_output
from slices.services.instances import OrderRequest, order_instance, record_event

logger = logging.getLogger(__name__)

# The console's variables of an app instance (beside JUPYTER_TOKEN and the base URL).
APP_ENV = "GPC_APP"
KEY_ENV = "GPC_APP_API_KEY"
MODEL_NAME_ENV = "APP_MODEL_NAME"
# How long the health check is asked before the page says the app does not answer, at least.
MIN_PATIENCE_S = 300
PROBE_TIMEOUT_S = 5.0
# The app's output while it starts is kept as log lines of this step, this many a look at most.
LOG_STEP = "app"
OUTPUT_BATCH_LINES = 200


# ---------------------------------------------------------------------------------------------
# The app's page: what it costs and what can run now
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AppChoice:
    """One GPU model the app runs on, priced for the chosen cards."""

    option: GpuOption
    label: str
    cards: int
    per_hour: Decimal
    available: bool | None  # the cards are free now (None: not asked, on a list of apps)
    trial_hours: Decimal | None  # how long the trial credit left lasts at this price (None: spent)
    balance_hours: Decimal | None  # how long the account's spendable balance lasts


@dataclass
class AppOffer:
    app: AiApp
    choices: list[AppChoice]
    chosen: AppChoice | None
    models: list[Any]  # marketplace Assets, in the manifest's order (missing ones left out)
    model: Any  # the chosen model's Asset
    datasets: list[Any]
    license: Any
    license_accepted: bool
    balance: Decimal
    trial_credit: Decimal
    image: Any
    problems: list[str] = field(default_factory=list)
    # What is left of the trial credit: all of it for a visitor (what a new account gets), the
    # wallet's trial balance for a signed-in user; 0 once spent, and then no trial claim is shown.
    trial_left: Decimal = billing.TRIAL_CREDIT

    @property
    def launchable(self) -> bool:
        return self.chosen is not None and self.chosen.available is True and not self.problems


def app_hours(amount: Decimal, per_hour: Decimal) -> Decimal | None:
    """How long ``amount`` lasts at ``per_hour`` (hours, one decimal), or None when free or when
    there is nothing to spend (a trial credit spent makes no claim)."""
    if per_hour <= 0 or amount <= 0:
        return None
    return (amount / per_hour).quantize(Decimal("0.1"))


def price_rates() -> dict[str, Decimal]:
    """On-demand 元 per card-hour by GPU model key, from one look at the current price book
    (placeholder prices are not orderable). A page that shows several apps reads it once."""
    return {
        billing.gpu_model_key(p.gpu_model): Decimal(p.on_demand_per_card_hour)
        for p, _terms in billing.price_list()
        if not p.is_placeholder
    }


def _capacity(gpu_model: str, cards: int) -> bool:
    try:
        preview_allocation(cards, gpu_model)
    except NoCapacity:
        return False
    return True


def trial_left(user: Any, summary: Any = None) -> Decimal:
    """What the trial credit has left for ``user``: the whole credit for a visitor (what signing
    up gives), the wallet's trial balance for an account (0 once spent or never granted)."""
    if not getattr(user, "is_authenticated", False):
        return billing.TRIAL_CREDIT
    summary = summary if summary is not None else billing.get_wallet_summary(user)
    return max(Decimal(summary.trial), Decimal("0"))


def _choice(
    option: GpuOption,
    cards: int,
    balance: Decimal,
    rates: dict[str, Decimal],
    trial: Decimal = billing.TRIAL_CREDIT,
) -> AppChoice | None:
    rate = rates.get(billing.gpu_model_key(option.gpu_model))
    if rate is None:
        return None
    per_hour = charge_for(rate, cards, 3600)  # what an order's quote says (billing.quote_order)
    return AppChoice(
        option=option,
        label=GPU_LABELS.get(option.gpu_model, option.gpu_model),
        cards=cards,
        per_hour=per_hour,
        available=None,
        trial_hours=app_hours(trial, per_hour),
        balance_hours=app_hours(balance, per_hour),
    )


def app_offer(
    user: Any,
    app: AiApp,
    *,
    gpu_model: str | None = None,
    cards: int | None = None,
    model: str | None = None,
    rates: dict[str, Decimal] | None = None,
    balance: Decimal | None = None,
    trial: Decimal | None = None,
    full: bool = True,
) -> AppOffer:
    """The app's offer for ``user``; ``gpu_model``, ``cards`` and ``model`` are the page's
    choices (the manifest's recommended ones when absent). ``full=False`` (a list of apps) prices
    every GPU model at its preset and looks nothing else up: no capacity, no catalogue rows.
    With ``full``, whether the chosen cards are free now is asked of the allocator (for the
    chosen GPU model only; without a choice, the first of the app's GPU models that is free)."""
    rates = price_rates() if rates is None else rates
    if balance is None or trial is None:
        summary = billing.get_wallet_summary(user)
        balance = summary.spendable if balance is None else balance
        trial = trial_left(user, summary) if trial is None else trial
    wanted = app.gpu_option(gpu_model) if gpu_model else None
    problems: list[str] = []
    if gpu_model and wanted is None:
        problems.append(gettext_noop("This app does not run on that GPU model."))
    presets = [
        c for c in (_choice(o, o.recommended_cards, balance, rates, trial) for o in app.gpus) if c
    ]
    target = wanted.gpu_model if wanted is not None else None
    if target is None and presets:
        target = presets[0].option.gpu_model
        if full:  # the first GPU model free now at its preset, else the app's first
            free = next((c for c in presets if _capacity(c.option.gpu_model, c.cards)), None)
            target = (free or presets[0]).option.gpu_model
    choices: list[AppChoice] = []
    for choice in presets:
        if choice.option.gpu_model == target and cards is not None and cards != choice.cards:
            choice = _choice(choice.option, cards, balance, rates, trial) or choice
        choices.append(choice)
    chosen = next((c for c in choices if c.option.gpu_model == target), None)
    if full and chosen is not None and chosen.cards > 0:
        chosen = replace(chosen, available=_capacity(chosen.option.gpu_model, chosen.cards))
        choices = [chosen if c.option == chosen.option else c for c in choices]
    if not full:
        return AppOffer(
            app=app,
            choices=choices,
            chosen=chosen,
            models=[],
            model=None,
            datasets=[],
            license=None,
            license_accepted=False,
            balance=balance,
            trial_credit=billing.TRIAL_CREDIT,
            image=None,
            problems=problems,
            trial_left=trial,
        )
    if chosen is not None and not (
        chosen.option.min_cards <= chosen.cards <= chosen.option.max_cards
    ):
        problems.append(gettext_noop("Choose a number of cards this app runs on."))
    if chosen is not None and chosen.cards not in (1, 2, 4, 8):
        problems.append(gettext_noop("A host has 1, 2, 4 or 8 cards."))
    found = marketplace.assets_by_hub_id("model", app.models)
    models = [found[h] for h in app.models if h in found]
    picked = found.get(model) if model else None
    if model and picked is None:
        problems.append(gettext_noop("Choose one of the app's models."))
    picked = picked or (models[0] if models else None)
    found_data = marketplace.assets_by_hub_id("dataset", app.datasets) if app.datasets else {}
    datasets = [found_data[h] for h in app.datasets if h in found_data]
    try:
        image = marketplace.get_image_version(app.image)
    except Http404:
        image = None
    if picked is None or image is None or len(datasets) != len(app.datasets):
        problems.append(gettext_noop("The app's model, dataset or image is not in the catalogue."))
    license = picked.license if picked is not None else None
    if chosen is not None and not billing.covers_app_launch(balance, chosen.per_hour):
        problems.append(gettext_noop("Your balance does not cover six minutes of this app."))
    return AppOffer(
        app=app,
        choices=choices,
        chosen=chosen,
        models=models,
        model=picked,
        datasets=datasets,
        license=license,
        license_accepted=marketplace.has_accepted_license(user, license),
        balance=balance,
        trial_credit=billing.TRIAL_CREDIT,
        image=image,
        problems=problems,
        trial_left=trial,
    )


def app_settings_env() -> dict[str, str]:
    """The deployment's extra variables of every app run (``APP_EXTRA_ENV``: a bare test host
    points ``APP_DIR`` at a copy of the app's directory)."""
    return {str(k): str(v) for k, v in dict(getattr(settings, "APP_EXTRA_ENV", {}) or {}).items()}


def launch_app(
    user: Any,
    app: AiApp,
    *,
    gpu_model: str | None = None,
    cards: int | None = None,
    model: str | None = None,
    accept_license: bool = False,
    name: str = "",
    idempotency_key: str | None = None,
    request: Any = None,
) -> Instance:
    """Order ``app``: refused with ``OrderRefused`` (what is wrong) or what ``order_instance``
    raises; the same ``idempotency_key`` returns the instance the first click ordered."""
    if idempotency_key:
        existing = Instance.objects.filter(
            team=team_of(user), idempotency_key=idempotency_key
        ).first()
        if existing is not None:
            return existing
    offer = app_offer(user, app, gpu_model=gpu_model, cards=cards, model=model)
    if offer.problems:
        raise OrderRefused(offer.problems[0])
    chosen = offer.chosen
    assert chosen is not None and offer.model is not None
    if offer.license is not None and not offer.license_accepted:
        if not accept_license:
            raise OrderRefused(
                gettext_noop("Accept the licence of the weights (%(license)s) to launch the app."),
                license=offer.license.name,
            )
        marketplace.accept_license(user, offer.license)
    asset_ids = [str(offer.model.public_id)] + [str(d.public_id) for d in offer.datasets]
    specs = marketplace.build_mount_specs(user, asset_ids)
    targets = {s.kind: s.target for s in specs}
    env = {
        **app.env,
        MODEL_NAME_ENV: offer.model.hub_id,
        "MODEL_DIR": targets["model"],
        **({"DATASET_DIR": targets["dataset"]} if "dataset" in targets else {}),
        **app_settings_env(),
    }
    req = OrderRequest(
        gpu_model=chosen.option.gpu_model,
        cards=chosen.cards,
        name=name or f"{app.slug}-{uuid.uuid4().hex[:4]}",
        image=app.image,
        asset_ids=tuple(asset_ids),
        platform_env=env,
        entrypoint=app.command,
        app=app.slug,
        app_model=offer.model.hub_id,
    )
    instance, _created = order_instance(user, req, idempotency_key=idempotency_key, request=request, audit_action="app.launch")  # fmt: skip
    return instance


# ---------------------------------------------------------------------------------------------
# Once it runs: the health check
# ---------------------------------------------------------------------------------------------


def app_of(instance: Instance) -> AiApp | None:
    return aiapps.get_app(instance.app) if instance.app else None


def is_ready(instance: Instance) -> bool:
    """The app answered its health check since the instance last started running."""
    return bool(
        instance.app_ready_at
        and instance.running_at
        and instance.app_ready_at >= instance.running_at
    )


def health_target(instance: Instance, app: AiApp) -> str:
    """The health check's request target on the node: the manifest's path (every app is served
    at "/" of its own host, JupyterLab too)."""
    return app.health.path


def probe(instance: Instance, app: AiApp, *, timeout: float = PROBE_TIMEOUT_S) -> int | None:
    """One health check through the driver's tunnel: the HTTP status, or None (nothing answers)."""
    try:
        spec, node, node_port = proxy.tunnel_target(instance, app.health.port)
    except Http404:
        return None
    driver: Any = get_driver(instance.driver or None)
    try:
        chan = driver.open_tunnel(spec, node, node_port)
    except DriverError:
        return None
    try:
        chan.settimeout(timeout)
        request = (
            f"GET {health_target(instance, app)} HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{app.health.port}\r\n"
            f"Authorization: token {instance.access_token}\r\n"
            "User-Agent: gpu-console-health\r\nConnection: close\r\n\r\n"
        )
        chan.sendall(request.encode("latin-1"))
        head = b""
        deadline = time.monotonic() + timeout
        while b"\r\n" not in head and len(head) < 4096 and time.monotonic() < deadline:
            data = chan.recv(1024)
            if not data:
                break
            head += data
        line = head.split(b"\r\n", 1)[0].split()
        if len(line) >= 2 and line[0].startswith(b"HTTP/") and line[1].isdigit():
            return int(line[1])
        return None
    except (TimeoutError, OSError, EOFError):
        return None
    finally:
        with contextlib.suppress(OSError):
            chan.close()


def _follow_output(instance: Instance) -> bool:
    """The app's output since the last look, kept as log lines (step ``app``) while it starts, so
    a model that fails to load says why on the page; False when its process has ended."""
    from slices.services.provisioning import build_spec  # provisioning imports ports

    driver: Any = get_driver(instance.driver or None)
    if not capabilities(driver.name).workload_output:
        return True
    reader = driver.workload_output
    spec = build_spec(instance)
    if not spec.nodes:
        return True
    node = spec.nodes[0]
    offset = instance.output_read  # the lines kept so far (a field written with them)
    elapsed = (timezone.now() - (instance.running_at or timezone.now())).total_seconds()
    try:
        out = reader(spec, node, offset, elapsed, OUTPUT_BATCH_LINES)
    except Exception as exc:  # a dropped link: the health check decides; read again next time
        logger.warning("reading the app output of %s failed: %s", instance.public_id, exc)
        return True
    lines = list(out.lines)[:OUTPUT_BATCH_LINES]
    record_output(instance, node.hostname, LOG_STEP, lines)
    return bool(out.running)


def patience_s(app: AiApp) -> int:
    return max(MIN_PATIENCE_S, 3 * app.ready_seconds)


def follow_app(instance_id: int) -> str:
    """One health check of a running app: "ready" (recorded once), "again" (ask later),
    "gave_up" (it has not answered for ``patience_s``: a warning on the page, once) or "gone"."""
    instance = Instance.objects.filter(pk=instance_id).first()
    if instance is None or instance.state != InstanceState.RUNNING or instance.running_at is None:
        return "gone"
    app = app_of(instance)
    if app is None:
        return "gone"
    if is_ready(instance):
        return "ready"
    running = _follow_output(instance)
    status = probe(instance, app)
    now = timezone.now()
    if status == app.health.status:
        with transaction.atomic():
            won = (
                Instance.objects.filter(pk=instance.pk, state=InstanceState.RUNNING)
                .exclude(app_ready_at__gte=instance.running_at)
                .update(app_ready_at=now)
            )
            if won:
                instance.app_ready_at = now
                seconds = int((now - instance.running_at).total_seconds())
                record_event(
                    instance, EventKind.STATE, code="app_ready", params={"seconds": seconds}
                )
                events.broadcast_state_on_commit(instance)
        return "ready"
    waited = (now - instance.running_at).total_seconds()
    if not running:
        # The app's process ended before it answered: say so now (its output is in the logs).
        record_event(
            instance, EventKind.STATE, code="app_exited", level=EventLevel.WARNING, params={}
        )
        events.broadcast_state_on_commit(instance)
        return "gave_up"
    if waited > patience_s(app):
        with transaction.atomic():
            # Once per start: the field is written with its warning (as app_ready_at with its
            # event); a start later than it (running_at) warns again.
            won = (
                Instance.objects.filter(pk=instance.pk)
                .exclude(app_gave_up_at__gte=instance.running_at)
                .update(app_gave_up_at=now)
            )
            if won:
                instance.app_gave_up_at = now
                record_event(
                    instance,
                    EventKind.STATE,
                    code="app_not_answering",
                    params={"minutes": int(waited // 60), "path": app.health.path},
                    level=EventLevel.WARNING,
                    at=now,
                )
                events.broadcast_state_on_commit(instance)
        return "gave_up"
    return "again"


def on_running(instance_id: int) -> None:
    """An app instance reached running (an order or a start): watch its health check."""
    instance = Instance.objects.filter(pk=instance_id).only("app").first()
    if instance is None or not instance.app:
        return
    jobs.enqueue("slices.tasks.follow_app_task", instance_id)


def follow_running_apps() -> int:
    """Celery beat: app instances running but not ready whose follower was lost are followed."""
    horizon = timezone.now() - timedelta(hours=6)
    ids = list(
        Instance.objects.filter(
            state=InstanceState.RUNNING, running_at__gte=horizon, app_ready_at__isnull=True
        )
        .exclude(app="")
        .values_list("pk", flat=True)[:200]
    )
    for pk in ids:
        jobs.enqueue("slices.tasks.follow_app_task", pk)
    return len(ids)


# ---------------------------------------------------------------------------------------------
# The page's and the API's view of an app instance
# ---------------------------------------------------------------------------------------------


def api_base_path(instance: Instance) -> str:
    app = app_of(instance)
    base = app.api.base_path if app and app.api else "/v1"
    return f"/apps/{instance.public_id}{base}"


@dataclass(frozen=True)
class AppStatus:
    app: AiApp
    state: str  # "waiting" (not running), "starting", "ready", "not_answering"
    waited_s: int
    percent: int
    model: str
    open_url: str
    api_path: str  # "" when the app serves no API
    api_key: str


def app_status(instance: Instance) -> AppStatus | None:
    app = app_of(instance)
    if app is None:
        return None
    waited = 0
    if instance.state != InstanceState.RUNNING or instance.running_at is None:
        state = "waiting"
    elif is_ready(instance):
        state = "ready"
    else:
        waited = int((timezone.now() - instance.running_at).total_seconds())
        state = "not_answering" if waited > patience_s(app) else "starting"
    percent = 100 if state == "ready" else min(95, int(100 * waited / max(1, app.ready_seconds)))
    return AppStatus(
        app=app,
        state=state,
        waited_s=waited,
        percent=percent,
        model=instance.app_model,
        open_url=f"/instances/{instance.public_id}/web-ports/{app.primary_port.port}/open/",
        api_path=api_base_path(instance) if app.api else "",
        api_key=instance.app_api_key,
    )


# ---------------------------------------------------------------------------------------------
# The API through the console: /apps/<instance>/v1/... with the app's key
# ---------------------------------------------------------------------------------------------


class ApiKeyRefused(Exception):  # noqa: N818 - the outcome, answered 401
    """No key, a wrong key, or no running app with an API there (one answer for all three)."""


def resolve_api_access(public_id: Any, key: str) -> proxy.Access:
    """The tunnel target of the app's API for a request bearing ``key``, or ``ApiKeyRefused``."""
    instance = ports.running_instance(public_id)
    app = app_of(instance) if instance is not None else None
    if instance is None or app is None or app.api is None or not instance.app_api_key:
        # Compare anyway: a wrong id and a wrong key take the same time.
        hmac.compare_digest(key.encode(), b"sk-gpc-" + b"0" * 40)
        raise ApiKeyRefused
    if not key or not hmac.compare_digest(key.encode(), instance.app_api_key.encode()):
        raise ApiKeyRefused
    spec, node, node_port = proxy.cached_tunnel_target(instance, app.api.port)
    return proxy.Access(
        instance=instance,
        port=app.api.port,
        via="api-key",
        share_link_id=None,
        spec=spec,
        node=node,
        node_port=node_port,
        keep_prefix=False,
        prefix=f"/apps/{instance.public_id}",
    )
