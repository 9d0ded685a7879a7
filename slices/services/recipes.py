"""Recipe runs: the one-click demo's offer and launch, and following a running recipe's output.

- ``demo_offer``: what the demo page shows, priced on the current price book: the cards, the time
  limit cut so the most it can cost stays below the budget (the trial credit), the licence of the
  weights and whether it is accepted, and whether the cards are free now (else the cheapest
  8-card model whose cost fits, or when the cards are expected to be free).
- ``launch_recipe``: accept the licence (when the page's checkbox says so) and order the recipe
  through ``order_instance``: its image, its model and dataset mounted, its entrypoint, its
  environment, and an automatic release at the time limit. One live demo run per account (under
  the account's order lock; a second launch raises ``DemoRunLive``, 409, naming the live run), its
  parameters within the recipe's bounds, and only a GPU model the offer names (never a stand-in).
- ``follow_recipe``: while the instance runs, read the recipe's output from the node (the ``sim``
  driver simulates it), keep each line as a log event, and release the instance when the recipe
  prints its ``done`` line or exits (the time limit is the reconciler's automatic release). Each
  task run is one bounded pass; the task queues itself again rather than wait in a worker thread.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.http import Http404
from django.utils import timezone
from django.utils.translation import gettext_noop

from billing import services as billing
from console.tenancy import team_of
from marketplace import recipes as catalogue_recipes
from marketplace import services as marketplace
from marketplace.catalogue import GPU_LABELS, gpu_code
from marketplace.recipes import Recipe
from slices import events, progress
from slices.choices import EventKind, EventLevel, InstanceState
from slices.drivers import DriverError, capabilities, get_driver
from slices.errors import InstanceConflict, OrderRefused
from slices.lifecycle import LIVE
from slices.models import Instance, InstanceEvent, SlurmCluster, SlurmJob
from slices.services import jobs, storage
from slices.services.allocation import NoCapacity, preview_allocation
from slices.services.history import record_output
from slices.services.instances import (
    OrderRequest,
    _lock_quota,
    order_instance,
    price_name,
    record_event,
    release_instance,
)

logger = logging.getLogger(__name__)

# The instance's environment names its recipe and run; the console reads them back.
RECIPE_ENV = "RECIPE"
RUN_ENV = "RUN_NAME"
# Log events of a recipe's output carry this step (provisioning logs carry theirs).
RUN_STEP = "run"
# One demo run per account at a time: a run in these states (not yet releasing) is live.
DEMO_LIVE_STATES = tuple(s.value for s in LIVE if s != InstanceState.RELEASING)
# The recipe must save its adapter before the automatic release: it is told to stop this much
# before the time limit, after the expected provisioning time.
RELEASE_MARGIN_SECONDS = 60
OUTPUT_BATCH_LINES = 200
# What a recipe's Slurm slice runs as its instance's command: nothing (the job is the work).
SLURM_IDLE = "sleep infinity"


# ---------------------------------------------------------------------------------------------
# The demo page's offer
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """One way to run the recipe now: a GPU model, its price and what the run costs at most."""

    gpu_model: str
    per_hour: Decimal
    time_limit_s: int
    max_cost: Decimal
    available: bool


@dataclass
class DemoOffer:
    recipe: Recipe
    budget: Decimal
    choice: Choice | None  # what the launch button orders (None: nothing can run now)
    preferred: Choice | None  # the recipe's own GPU model
    earliest: datetime | None  # when the preferred cards are expected to be free
    model: Any  # marketplace Asset or None
    dataset: Any
    license: Any  # marketplace License or None
    license_accepted: bool
    balance: Decimal
    trial: Decimal
    image: Any  # ImageVersion or None
    problems: list[str] = field(default_factory=list)

    @property
    def substitute(self) -> bool:
        return self.choice is not None and self.choice.gpu_model != self.recipe.gpu_model

    @property
    def launchable(self) -> bool:
        return self.choice is not None and not self.problems


class DemoRunLive(InstanceConflict):
    """A second demo run while one is live: one at a time per account (the page opens the live
    one; a script gets 409 with its id)."""

    def __init__(self, live: Instance) -> None:
        super().__init__(
            gettext_noop(
                "Your demo run %(name)s is still running: one demo run at a time per account. "
                "Release it or wait for it to finish to launch another."
            ),
            name=live.name,
            instance=str(live.public_id),
        )
        self.live = live


def budget_for(recipe: Recipe) -> Decimal:
    """The most a run may cost: the trial credit for the demo (billing's figure, not a copy)."""
    return billing.TRIAL_CREDIT


def time_limit_for(per_hour: Decimal, minutes: int, budget: Decimal) -> int:
    """The recipe's time limit in seconds, cut to whole minutes so that ``per_hour`` for that long
    stays below ``budget``; never raised."""
    if per_hour <= 0:
        return minutes * 60
    affordable = math.floor(budget * 60 / per_hour)  # whole minutes the budget pays for
    if per_hour * affordable / 60 >= budget:
        affordable -= 1  # strictly below the budget
    return max(0, min(minutes, affordable)) * 60


def _choice(user: Any, recipe: Recipe, gpu_model: str, budget: Decimal) -> Choice | None:
    book_name = price_name(gpu_model)
    if book_name is None:
        return None
    per_hour = billing.quote_for(user, book_name, recipe.cards).per_hour
    limit = time_limit_for(per_hour, recipe.time_limit_minutes, budget)
    if limit < 5 * 60:
        return None  # the budget pays for less than a useful run on this model
    try:
        preview_allocation(recipe.cards, gpu_model)
        available = True
    except NoCapacity:
        available = False
    return Choice(gpu_model, per_hour, limit, billing.most_charged(per_hour, limit), available)


def _asset(kind: str, hub_id: str) -> Any:
    try:
        return marketplace.get_asset_by_hub_id(kind, hub_id)
    except Http404:
        return None


def demo_offer(user: Any, recipe: Recipe) -> DemoOffer:
    wallet = billing.get_wallet_summary(user)
    # The trial credit for the one-click demo; a Slurm slice is paid from the balance.
    budget = wallet.spendable if recipe.budget == "balance" else budget_for(recipe)
    preferred = _choice(user, recipe, recipe.gpu_model, budget)
    choice = preferred if preferred is not None and preferred.available else None
    earliest = None
    if choice is None:
        alternatives = [
            c
            for c in (_choice(user, recipe, m, budget) for m in recipe.alternatives)
            if c is not None and c.available
        ]
        choice = min(alternatives, key=lambda c: (c.max_cost, c.gpu_model), default=None)
        try:
            preview_allocation(recipe.cards, recipe.gpu_model)
        except NoCapacity as exc:
            earliest = exc.earliest
    model = _asset("model", recipe.model)
    dataset = _asset("dataset", recipe.dataset)
    try:
        image = marketplace.get_image_version(recipe.image)
    except Http404:
        image = None
    license = model.license if model is not None else None
    problems = []
    if model is None or dataset is None or image is None:
        problems.append(
            gettext_noop("The recipe's model, dataset or image is not in the catalogue.")
        )
    if choice is not None and wallet.spendable < choice.max_cost:
        problems.append(gettext_noop("Your balance does not cover the most this run can cost."))
    return DemoOffer(
        recipe=recipe,
        budget=budget,
        choice=choice,
        preferred=preferred,
        earliest=earliest,
        model=model,
        dataset=dataset,
        license=license,
        license_accepted=marketplace.has_accepted_license(user, license),
        balance=wallet.spendable,
        trial=getattr(wallet, "trial", Decimal("0")),
        image=image,
        problems=problems,
    )


# ---------------------------------------------------------------------------------------------
# Launching
# ---------------------------------------------------------------------------------------------


def provisioning_allowance_s(driver_name: str | None = None) -> int:
    """Seconds the instance is expected to take to reach running (the driver's step times)."""
    try:
        steps = get_driver(driver_name).step_seconds()
    except ValueError:
        return 0
    return int(sum(v for k, v in steps.items() if k not in ("allreduce", "teardown")))


def launch_recipe(
    user: Any,
    recipe: Recipe,
    *,
    accept_license: bool,
    gpu_model: str | None = None,
    idempotency_key: str | None = None,
    request: Any = None,
) -> Instance:
    """Order ``recipe`` on the offer's choice (or ``gpu_model`` when the page named one the offer
    allows). Raises ``OrderRefused`` when the licence is not accepted or nothing fits the budget,
    or what ``order_instance`` raises. The same ``idempotency_key`` (the page's launch form) returns
    the run the first click started: a double click launches once."""
    if idempotency_key:
        existing = Instance.objects.filter(
            team=team_of(user), idempotency_key=idempotency_key
        ).first()
        if existing is not None:
            return existing
    _refuse_a_second_run(user)
    check_parameters(recipe)
    offer = demo_offer(user, recipe)
    choice = _chosen(recipe, offer, gpu_model)
    if offer.model is None or offer.dataset is None or offer.image is None:
        raise OrderRefused(
            gettext_noop("The recipe's model, dataset or image is not in the catalogue.")
        )
    if offer.license is not None and not offer.license_accepted:
        if not accept_license:
            raise OrderRefused(
                gettext_noop("Accept the licence of the weights (%(license)s) to launch the demo."),
                license=offer.license.name,
            )
        marketplace.accept_license(user, offer.license)
    limit = _override_limit(choice.time_limit_s)
    run = f"{recipe.demo}-{uuid.uuid4().hex[:6]}"
    specs = marketplace.build_mount_specs(user, [offer.model.public_id, offer.dataset.public_id])
    targets = {s.kind: s.target for s in specs}
    env = {
        **recipe.env,
        RECIPE_ENV: recipe.slug,
        RUN_ENV: run,
        "CHECKPOINT_RUN": run,  # the console's checkpoint convention (hot migration resumes it)
        "MODEL_DIR": targets["model"],
        "DATASET_DIR": targets["dataset"],
        "TIME_LIMIT_S": str(max(60, limit - provisioning_allowance_s() - RELEASE_MARGIN_SECONDS)),
        **{str(k): str(v) for k, v in dict(settings.RECIPE_EXTRA_ENV).items()},
    }
    req = OrderRequest(
        gpu_model=choice.gpu_model,
        cards=recipe.cards,
        name=run,
        image=recipe.image,
        asset_ids=(str(offer.model.public_id), str(offer.dataset.public_id)),
        platform_env=env,  # the console's (RECIPE, RUN_NAME...): exempt from the customer rule
        auto_release_at=timezone.now() + timedelta(seconds=limit),
        entrypoint=recipe.entrypoint,
    )
    if recipe.mode == "slurm":
        req = _slurm_order(req, recipe, env, limit)
    with transaction.atomic():
        # The account's orders queue on its quota row: of concurrent launches, the first orders
        # and the others find its run live (or, with the same launch key, return it).
        _lock_quota(user)
        if idempotency_key:
            existing = Instance.objects.filter(
                team=team_of(user), idempotency_key=idempotency_key
            ).first()
            if existing is not None:
                return existing
        _refuse_a_second_run(user)
        instance, _created = order_instance(user, req, idempotency_key=idempotency_key, request=request, audit_action="demo.run")  # fmt: skip
    return instance


def _slurm_order(
    req: OrderRequest, recipe: Recipe, env: dict[str, str], limit: int
) -> OrderRequest:
    """The recipe as a multi-node Slurm job (issue 31): a slice with its own Slurm in job mode,
    the recipe's batch script submitted once it runs with the run's environment as data (the
    node's own names, PATH and HOME, are the node's), released when the job ends; the time
    limit stays the automatic release behind it."""
    job_env = {k: v for k, v in env.items() if k not in ("PATH", "HOME")}
    job = {
        "script": recipe.batch_script(),
        "name": env[RUN_ENV],
        "nodes": recipe.slurm_nodes,
        "gpus_per_node": recipe.cards_per_node,
        "time_limit": max(1, limit // 60),
        "environment": job_env,
    }
    # The nodes only hold the instance (its Slurm daemons, the terminal): the job is the work.
    return replace(req, entrypoint=SLURM_IDLE, scheduler="slurm", job=job, release_on_job_end=True)


def _ordered_on_slurm(instance: Instance) -> bool:
    """Whether the instance was ordered with a Slurm job (job mode): its recipe runs as that
    job, followed by the job follower, not by ``follow_recipe``."""
    return SlurmCluster.objects.filter(instance=instance).exclude(job_request={}).exists()


def live_demo_run(user: Any) -> Instance | None:
    """The account's recipe run that holds (or is about to hold) GPUs, if any."""
    return (
        Instance.objects.for_team(user)
        .filter(state__in=DEMO_LIVE_STATES, env__has_key=RECIPE_ENV)
        .order_by("-created_at")
        .first()
    )


def _refuse_a_second_run(user: Any) -> None:
    live = live_demo_run(user)
    if live is not None:
        raise DemoRunLive(live)


def check_parameters(recipe: Recipe) -> None:
    """The run's parameters (the recipe's defaults and what the console adds) are within the
    recipe's bounds, or ``OrderRefused`` names the first one outside and its bounds."""
    params = {**recipe.env, **{str(k): str(v) for k, v in dict(settings.RECIPE_EXTRA_ENV).items()}}
    try:
        recipe.check_parameters(params)
    except catalogue_recipes.ParameterOutOfBounds as exc:
        raise OrderRefused(
            gettext_noop(
                "The recipe parameter %(name)s must be a whole number from %(low)s to %(high)s, "
                "not %(value)s."
            ),
            name=exc.name,
            low=exc.low,
            high=exc.high,
            value=exc.value,
        ) from exc


def _chosen(recipe: Recipe, offer: DemoOffer, gpu_model: str | None) -> Choice:
    """The offer's choice, or the GPU model the page named: one the demo offers now, else a
    refusal that says so (never another model in its place)."""
    if gpu_model:
        code = gpu_code(gpu_model)
        offered = {
            c.gpu_model: c for c in (offer.choice, offer.preferred) if c is not None and c.available
        }
        if offered and code not in offered:
            models = [GPU_LABELS.get(m, m) for m in offered]
            raise OrderRefused(
                gettext_noop(
                    "The demo does not run on %(gpu_model)s now; it offers %(offered)s. Reload "
                    "the page to see its current offer."
                ),
                gpu_model=str(gpu_model)[:40],
                offered=", ".join(models),
            )
        choice: Choice | None = offered.get(code)
    else:
        choice = offer.choice
    if choice is None or not choice.available:
        raise OrderRefused(
            gettext_noop("No %(cards)s-card machine that fits the budget is free now."),
            cards=recipe.cards,
        )
    return choice


def _override_limit(limit: int) -> int:
    """``RECIPE_TIME_LIMIT_SECONDS`` (tests, demonstrations) shortens the limit, never lengthens it."""
    override = int(getattr(settings, "RECIPE_TIME_LIMIT_SECONDS", 0) or 0)
    return min(limit, override) if override > 0 else limit


# ---------------------------------------------------------------------------------------------
# A run's progress and result
# ---------------------------------------------------------------------------------------------


def recipe_of(instance: Instance) -> Recipe | None:
    slug = (instance.env or {}).get(RECIPE_ENV, "")
    return catalogue_recipes.get_recipe(slug) if slug else None


def output_lines(instance: Instance) -> list[str]:
    """The recipe's output: the order's Slurm job's (its cached tail) for a run on Slurm,
    else what the follower kept from the node."""
    job = SlurmJob.objects.filter(instance=instance, from_order=True).only("output").first()
    if job is not None:
        return job.output.splitlines()
    return list(
        InstanceEvent.objects.filter(instance=instance, kind=EventKind.LOG, step=RUN_STEP)
        .order_by("pk")
        .values_list("text", flat=True)
    )


def run_progress(instance: Instance) -> progress.RunProgress:
    return progress.summarise(output_lines(instance))


# ---------------------------------------------------------------------------------------------
# Following a running recipe
# ---------------------------------------------------------------------------------------------


def follow_recipe(instance_id: int, *, budget_s: float | None = None, driver: Any = None) -> str:
    """Read a running recipe's output: what is due now (at most ``FOLLOW_MAX_LINES`` lines), then
    for up to ``budget_s`` more seconds (``RECIPE_FOLLOW_SECONDS``; 0 = this one pass). Returns
    "again" when the run goes on: the task queues itself ``RECIPE_FOLLOW_INTERVAL`` later, so a
    follower holds a worker thread only while it has lines to store, never while it waits (four
    followers on the embedded worker's four threads would otherwise starve every other customer's
    provisioning, settlement and reconciliation). One follower per instance (a cache lock); safe
    to call twice."""
    instance = Instance.objects.filter(pk=instance_id).select_related("team", "created_by").first()
    if instance is None or instance.state != InstanceState.RUNNING or recipe_of(instance) is None:
        return "nothing to do"
    if _ordered_on_slurm(instance):
        return "slurm job"  # the job follower reads its output and releases the slice
    interval = float(settings.RECIPE_FOLLOW_INTERVAL)
    budget = max(0.0, float(budget_s if budget_s is not None else settings.RECIPE_FOLLOW_SECONDS))
    lock = f"recipe-follow:{instance.pk}"
    if not cache.add(lock, "1", timeout=int(budget + 60)):
        return "busy"
    # Between passes no lock is held: this mark says a follower will come back (the beat starts
    # one only for a running recipe without it).
    followed = _followed_key(instance)
    cache.set(followed, "1", timeout=int(interval + budget + 60))
    result = "again"
    try:
        result = _follow(instance, driver or get_driver(instance.driver or None), budget, interval)
        return result
    finally:
        cache.delete(lock)
        if result != "again":
            cache.delete(followed)


# A follower task run stores at most this many output lines; the next run goes on from there.
FOLLOW_MAX_LINES = 10 * OUTPUT_BATCH_LINES


def _followed_key(instance: Instance) -> str:
    return f"recipe-followed:{instance.public_id}"


def _done_line(lines: list[str]) -> bool:
    return any((progress.parse_line(line) or {}).get("event") == "done" for line in lines)


def _follow(instance: Instance, driver: Any, budget: float, interval: float) -> str:
    """The follower's loop, bounded per task run: ``FOLLOW_MAX_LINES`` lines and ``budget``
    seconds (each read is bounded by the driver: a window of lines, an SSH command timeout)."""
    from slices.services.provisioning import build_spec  # provisioning imports this module

    if not capabilities(driver.name).workload_output:
        return "unsupported"
    reader = driver.workload_output
    spec = build_spec(instance)
    if not spec.nodes:
        return "nothing to do"
    node = spec.nodes[0]  # rank 0 prints the recipe's progress
    offset = instance.output_read  # the lines kept so far (a field written with them)
    deadline = time.monotonic() + budget
    left = FOLLOW_MAX_LINES
    failures = 0
    while True:
        state = Instance.objects.filter(pk=instance.pk).values_list("state", flat=True).first()
        if state != InstanceState.RUNNING:
            return "stopped"
        running_at = instance.running_at or timezone.now()
        elapsed = (timezone.now() - running_at).total_seconds()
        try:
            out = reader(spec, node, offset, elapsed, min(OUTPUT_BATCH_LINES, left))
            failures = 0
        except Exception as exc:  # a dropped link: try again; the time limit still releases it
            failures += 1
            logger.warning("reading the output of %s failed: %s", instance.public_id, exc)
            if failures >= 5 or time.monotonic() + interval > deadline:
                return "again"
            time.sleep(interval)
            continue
        lines = list(out.lines)[: max(0, left)]
        if lines:
            record_output(instance, node.hostname, RUN_STEP, lines)
            offset += len(lines)
            left -= len(lines)
            _saved(instance, driver, spec.env, lines)
            if any(progress.parse_line(line) for line in lines):
                events.broadcast_progress_on_commit(instance)
        if _done_line(lines) or not out.running:
            return _finish(instance, run_progress(instance), out.running)
        if len(lines) >= OUTPUT_BATCH_LINES and left > 0:
            continue  # more is waiting
        if left <= 0 or time.monotonic() + interval > deadline:
            return "again"  # the next task run goes on (the worker serves others meanwhile)
        time.sleep(interval)


def _saved(instance: Instance, driver: Any, env: dict[str, str], lines: list[str]) -> None:
    """After ``checkpoint`` or ``done`` lines: the simulated fleet writes the files they announce
    (small, labelled simulated) into the account's PFS directory; then, for any driver, the
    instance's latest checkpoint and the account's /pfs usage are read again, so the instance
    page's checkpoint and /pfs cards agree with the training card (never "none yet" beside
    ``step-1000``, nor 0 bytes after the adapter was saved). Best effort: never stops the follower."""
    kinds = {(progress.parse_line(line) or {}).get("event") for line in lines}
    if not kinds & {"checkpoint", "done"}:
        return
    if capabilities(driver.name).simulated:
        try:
            driver.write_recipe_files(storage.account_root(instance.team), env, lines)
        except (OSError, DriverError) as exc:
            logger.warning("writing the simulated files of %s: %s", instance.public_id, exc)
    try:
        storage.refresh_checkpoint(instance)
        storage.measure_pfs(instance.team)
    except OSError as exc:
        logger.warning("reading the PFS of %s: %s", instance.public_id, exc)


def _finish(instance: Instance, run: progress.RunProgress, running: bool) -> str:
    """The recipe printed ``done`` (release: finished) or exited without it (release: exited)."""
    if run.done:
        record_event(
            instance,
            EventKind.STATE,
            code="recipe_done",
            params={"adapter": run.adapter, "step": run.step, "reason": run.done_reason},
        )
        release_instance(instance, by="recipe", code="recipe_finished")
        return "finished"
    if running:
        return "again"  # a "done" line the summary did not accept: keep reading
    record_event(
        instance,
        EventKind.ERROR,
        code="recipe_exited",
        level=EventLevel.WARNING,
        params={"checkpoint": run.last_checkpoint},
    )
    release_instance(instance, by="recipe", code="recipe_exited")
    return "exited"


def follow_running_recipes() -> int:
    """Beat: a running recipe whose follower is gone (its worker died) gets one again."""
    started = 0
    running = Instance.objects.filter(state=InstanceState.RUNNING, env__has_key=RECIPE_ENV)
    for instance in running.only("pk", "public_id"):
        pk = instance.pk
        if cache.get(_followed_key(instance)) is None and cache.get(f"recipe-follow:{pk}") is None:
            jobs.enqueue("slices.tasks.follow_recipe_task", pk)
            started += 1
    return started


def on_running(instance_id: int) -> None:
    """Provisioning reached running: follow the recipe, if the instance runs one."""
    instance = Instance.objects.filter(pk=instance_id).only("env", "state").first()
    if instance is None or not (instance.env or {}).get(RECIPE_ENV):
        return
    jobs.enqueue("slices.tasks.follow_recipe_task", instance_id)
