"""Instances: ordering, state changes, release, failure, billing hooks.

Every state change is a compare-and-set on ``Instance.state`` (``transition``) that writes an
``InstanceEvent`` in the same transaction and broadcasts it on commit (Zulip's do_* actions with
RealmAuditLog). The provisioning driver loop lives in ``slices.services.provisioning``; what runs
it is ``slices.tasks``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.http import Http404
from django.utils import timezone
from django.utils.translation import gettext_noop

from billing import services as billing
from billing.choices import BillingMode
from console import services as console_services
from console.audit import services as audit
from console.errors import DomainError, ErrorCode
from console.ids import parse_uuid
from console.models import Team
from console.names import NameRefused, clean_name
from console.tenancy import as_acting, team_of, user_of
from console.verification import services as verification
from marketplace import services as marketplace
from slices import envpolicy, events, lifecycle, topology
from slices.choices import AllocationKind, EventKind, EventLevel, InstanceState
from slices.errors import OrderRefused, QuotaExceeded, member_quota_exceeded, quota_exceeded
from slices.models import (
    Allocation,
    GpuModel,
    GpuQuota,
    Instance,
    InstanceNode,
    Region,
)
from slices.services import access, ports
from slices.services import disks as disk_service
from slices.services import slurm as slurm_service
from slices.services.allocation import NoCapacity, allocate, release_allocation
from slices.services.history import record_event, record_logs  # noqa: F401 (re-exported)
from slices.services.jobs import enqueue_on_commit

logger = logging.getLogger(__name__)

# Usage sessions that bill an instance carry this kind and the instance's public id.
INSTANCE_RESOURCE = "instance"
MAX_ENV_VARS = 32


# ---------------------------------------------------------------------------------------------
# Fetchers
# ---------------------------------------------------------------------------------------------


def get_instance_for_user(user: Any, public_id: Any, *, operate: bool | None = None) -> Instance:
    """The acting team's instance, or 404 (another team's instance does not exist for them).

    To act on it (``operate``; by default when the Acting was resolved for a write), the member
    must be allowed to operate it: every instance of the team with ``operate_all``, their own with
    ``compute`` (a developer sees a teammate's instance but cannot stop it): else 403."""
    pid = parse_uuid(public_id)
    if pid is None:
        raise Http404
    instance = (
        Instance.objects.for_team(user)
        .select_related("gpu_model", "region", "allocation", "allocation__cluster")
        .filter(public_id=pid)
        .first()
    )
    if instance is None:
        raise Http404
    if operate is None:
        operate = bool(getattr(user, "writing", False))
    if operate and not as_acting(user).may_operate(instance):
        raise NotYours(gettext_noop("Only its maker or a team admin may change this instance."))
    return instance


class NotYours(DomainError, PermissionDenied):
    """A member may see the instance but not act on it: a 403 (the API's body, the 403 page)."""

    code = ErrorCode.PERMISSION_DENIED
    http_status = 403


def get_instance_for_operator(public_id: Any) -> Instance:
    pid = parse_uuid(public_id)
    instance = Instance.objects.filter(public_id=pid).first() if pid else None
    if instance is None:
        raise Http404
    return instance


# ---------------------------------------------------------------------------------------------
# Events and transitions
# ---------------------------------------------------------------------------------------------


_ENDS_WEB_ACCESS = frozenset(
    {
        InstanceState.STOPPING,
        InstanceState.STOPPED,
        InstanceState.RELEASING,
        InstanceState.RELEASED,
        InstanceState.FAILED,
    }
)


def transition(
    instance: Instance,
    dst: str,
    *,
    code: str,
    params: dict[str, Any] | None = None,
    level: str = EventLevel.INFO,
    **fields: Any,
) -> bool:
    """Move ``instance`` to ``dst`` if its state allows it (compare-and-set); True if this call won.

    The event row is written in the caller's transaction; the loser writes nothing.
    """
    now = timezone.now()
    with transaction.atomic():
        won = (
            Instance.objects.filter(pk=instance.pk, state__in=lifecycle.sources_of(dst)).update(
                state=dst, state_changed_at=now, **fields
            )
            == 1
        )
        if not won:
            return False
        instance.refresh_from_db()
        record_event(instance, EventKind.STATE, code=code, params=params or {}, level=level, at=now)
        events.broadcast_state_on_commit(instance)
        if dst == InstanceState.RUNNING or InstanceState.RUNNING in lifecycle.sources_of(dst):
            # An SSH endpoint appeared or went: the region gateway's keys follow (issue 19).
            access.sync_on_commit(instance)
        if dst in _ENDS_WEB_ACCESS:
            # Share links and every browser's grant to its web ports end with a stop (issue 29).
            ports.end_web_access(instance)
    return True


# ---------------------------------------------------------------------------------------------
# Ordering
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrderRequest:
    """An order as the form or the API gives it (validated by ``order_instance``)."""

    gpu_model: str
    cards: int
    name: str = ""
    region: str = ""
    image: str = ""
    asset_ids: tuple[str, ...] = ()
    ssh_key: str = ""  # an SSH key's public id; "" = the account's default key
    billing_mode: str = BillingMode.ON_DEMAND
    term_days: int | None = None
    auto_release_at: datetime | None = None
    env: dict[str, str] = field(default_factory=dict)
    # The console's own variables (a recipe launch: RECIPE, RUN_NAME, CHECKPOINT_RUN...): only
    # console code fills it; exempt from the platform-name rule, and it wins over ``env``.
    platform_env: dict[str, str] = field(default_factory=dict)
    # Cloud disks to attach: (disk public id, "rw" | "ro"); they pin the order to their region.
    disks: tuple[tuple[str, str], ...] = ()
    # A recipe's entrypoint (catalogue data, never user input): replaces the image's launch command.
    entrypoint: str = ""
    # Web ports to open through the console's proxy ([{"port": 7860, "name": "Gradio"}], ≤ 10).
    web_ports: tuple[dict[str, Any], ...] = ()
    # An AI application of the catalogue and its model (slices.services.apps; console code only):
    # the instance gets a key of its own for the app's API.
    app: str = ""
    app_model: str = ""
    # The slice's scheduler ("" = Slurm for a slice, none for a host) and job mode (issue 31).
    scheduler: str = ""
    job: dict[str, Any] | None = None
    release_on_job_end: bool | None = None
    # 排队 (issue 32): "queue" = wait when it cannot start now ("" = refuse, as before), for at
    # most ``max_wait_hours`` (None: SLICES_QUEUE_DEFAULT_MAX_WAIT_HOURS).
    when_unavailable: str = ""
    max_wait_hours: float | None = None
    # A booked window starting (issue 32; console code only): its public id (the allocator plans
    # it without its own hold) and its end, paid up front at booking: never charged per second.
    window: str = ""
    prepaid_until: datetime | None = None

    def fingerprint(self) -> str:
        body = {
            "gpu_model": billing.gpu_model_key(self.gpu_model),
            "cards": self.cards,
            "name": self.name,
            "region": self.region,
            "image": self.image,
            "assets": sorted(self.asset_ids),
            "ssh_key": self.ssh_key,
            "billing_mode": self.billing_mode,
            "term_days": self.term_days,
            "auto_release_at": self.auto_release_at.isoformat() if self.auto_release_at else None,
            "env": self.env,
            **({"platform_env": self.platform_env} if self.platform_env else {}),
            **({"disks": sorted(map(list, self.disks))} if self.disks else {}),
            **({"entrypoint": self.entrypoint} if self.entrypoint else {}),
            **({"web_ports": list(self.web_ports)} if self.web_ports else {}),
            **({"app": self.app, "app_model": self.app_model} if self.app else {}),
            **({"scheduler": self.scheduler} if self.scheduler else {}),
            **({"job": self.job, "release": self.release_on_job_end} if self.job else {}),
            **(
                {"queue": self.when_unavailable, "max_wait": self.max_wait_hours}
                if self.when_unavailable
                else {}
            ),
            **({"window": self.window} if self.window else {}),
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def resolve_gpu_model(value: str) -> GpuModel:
    """One code everywhere ("RTX4090"); input may also be the product name ("RTX 4090")."""
    key = billing.gpu_model_key(value or "")
    for model in GpuModel.objects.all():
        if billing.gpu_model_key(model.code) == key:
            return model
    raise OrderRefused(gettext_noop("Unknown GPU model %(gpu_model)s."), gpu_model=value)


def price_name(gpu_model: str) -> str | None:
    """The price book's name for a fleet GPU model code (they may differ in spacing)."""
    names = {
        billing.gpu_model_key(p.gpu_model): p.gpu_model
        for p, _t in billing.price_list()
        if not p.is_placeholder  # placeholder prices are for operators: not orderable
    }
    return names.get(billing.gpu_model_key(gpu_model))


def _clean_name(name: str, fallback: str) -> str:
    """The rules every customer-chosen name follows (console/names.py); blank: ``fallback``."""
    try:
        return clean_name(name) or fallback
    except NameRefused as exc:
        raise OrderRefused(exc.template, field=exc.field, **exc.params) from None


def _clean_env(env: Any, platform_env: dict[str, str] | None = None) -> dict[str, str]:
    """The instance's environment: the customer's ``env`` checked (``slices.envpolicy``: whole
    names, one-line values, none of the names the platform owns, all of them named), then the
    console's ``platform_env`` over it (a recipe launch's RECIPE, RUN_NAME...)."""
    if not isinstance(env, dict):
        raise OrderRefused(gettext_noop("The environment must map names to values."), field="env")
    if len(env) > MAX_ENV_VARS:
        raise OrderRefused(
            gettext_noop("At most %(max)d environment variables."), max=MAX_ENV_VARS, field="env"
        )
    out: dict[str, str] = {}
    for key, value in env.items():
        if not envpolicy.is_name(key):
            raise OrderRefused(
                gettext_noop(
                    "Environment variable names use A–Z, 0–9 and _ and start with a letter or _ "
                    "(%(name)s)."
                ),
                name=repr(str(key)[:64]),
                field="env",
            )
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise OrderRefused(
                gettext_noop("The value of %(name)s must be text of at most 4096 characters."),
                name=key,
                field="env",
            )
        problem = envpolicy.value_problem(str(value))
        if problem == "too_long":
            raise OrderRefused(
                gettext_noop("The value of %(name)s must be text of at most 4096 characters."),
                name=key,
                field="env",
            )
        if problem:
            raise OrderRefused(
                gettext_noop("The value of %(name)s must be one line (no line break or NUL)."),
                name=key,
                field="env",
            )
        out[key] = str(value)
    refused = envpolicy.refused_customer_names(out)
    if refused:
        raise OrderRefused(
            gettext_noop(
                "These environment variables are set by the platform and cannot be set in an "
                "order: %(names)s."
            ),
            names=", ".join(refused),
            field="env",
        )
    platform = dict(platform_env or {})
    wrong = [
        k
        for k, v in platform.items()
        if not envpolicy.is_name(k) or envpolicy.is_host_control(k) or envpolicy.value_problem(v)
    ]
    if wrong:  # the console's own mistake (a setting, a catalogue file): never sent to a node
        raise OrderRefused(
            gettext_noop(
                "These environment variables are set by the platform and cannot be set in an "
                "order: %(names)s."
            ),
            names=", ".join(sorted(repr(k)[:66] for k in wrong)),
            field="env",
        )
    return envpolicy.merged(out, platform)


def min_runway_seconds() -> int:
    """How long an order's balance must last (billing's rule; the order form says it)."""
    return billing.order_min_runway_seconds()


# States in which an instance holds or is about to hold cards before billing meters it (ordered,
# starting, moving to another node): billing's commitments. Running ones bill in billing's tables.
_COMMITTED_STATES = (
    InstanceState.PENDING,
    InstanceState.ALLOCATING,
    InstanceState.PROVISIONING,
    InstanceState.STARTING,
    InstanceState.MIGRATING,
)


def committed_resources(
    user: Any, *, exclude: Instance | None = None, member_id: int | None = None
) -> list[billing.Commitment]:
    """The account's instances billing will meter once they run, as billing's commitments (only
    ``member_id``'s when given)."""
    rows = (
        Instance.objects.for_team(user)
        .filter(state__in=_COMMITTED_STATES, gpuless=False)
        .select_related("gpu_model")
    )
    if exclude is not None:
        rows = rows.exclude(pk=exclude.pk)
    if member_id is not None:
        rows = rows.filter(created_by_id=member_id)
    return [
        billing.Commitment(
            INSTANCE_RESOURCE,
            str(i.public_id),
            i.gpu_model.code,  # billing matches the fleet code to its price name
            i.cards,
            i.term_days if i.billing_mode == BillingMode.TERM else None,
        )
        for i in rows
    ]


def _term_and_release(req: OrderRequest) -> tuple[int | None, float | None]:
    term_days = (req.term_days or 0) if req.billing_mode == BillingMode.TERM else None
    release_in = None
    if req.auto_release_at is not None and term_days is None:
        release_in = (req.auto_release_at - timezone.now()).total_seconds()
    return term_days, release_in


def check_funds(
    user: Any, price: str, req: OrderRequest, *, starting: Instance | None = None
) -> tuple[Any, Decimal]:
    """Billing's affordability check for an order, or for ``starting`` a stopped instance (开机):
    the balance must carry the account's whole burn with it (``billing.ensure_affordable``).
    Returns the quote and the price per hour (a term's locked rate). Call it again under
    ``_lock_quota`` to decide: it counts the orders committed before."""
    term_days, release_in = _term_and_release(req)
    quote = billing.ensure_affordable(
        user,
        price,
        req.cards,
        term_days=term_days,
        release_in_seconds=release_in,
        committed=committed_resources(user, exclude=starting),
    )
    return quote, quote.per_hour_for(term_days)


def check_member_limits(
    who: Any, price: str, req: OrderRequest, *, starting: Instance | None = None
) -> None:
    """The acting member's own limits in the team (issue 30), for an order or for ``starting``
    a stopped instance (whose maker's limits apply: the usage is theirs): their card quota
    (``QuotaExceeded``, 409: held, quota, cards) and their monthly budget (billing's
    ``ensure_member_within_budget``, 402). Called under ``_lock_quota`` (the team's lock), so
    concurrent orders of one member never pass either on the same cards or the same money."""
    row = billing.member_limits(who)
    if row is None or (row.gpu_quota is None and row.budget_monthly is None):
        return
    if row.gpu_quota is not None:
        held_rows = Instance.objects.for_team(who).live().filter(created_by_id=row.user_id)
        if starting is not None:
            held_rows = held_rows.exclude(pk=starting.pk)
        held = int(held_rows.aggregate(n=Sum("cards"))["n"] or 0)
        if held + req.cards > row.gpu_quota:
            raise member_quota_exceeded(row.gpu_quota, held, req.cards)
    if row.budget_monthly is not None:
        term_days, release_in = _term_and_release(req)
        billing.ensure_member_within_budget(
            who,
            price,
            req.cards,
            term_days=term_days,
            release_in_seconds=release_in,
            committed=committed_resources(who, exclude=starting, member_id=row.user_id),
        )


def quota_for(user: Any) -> int:
    row = GpuQuota.objects.filter(team=team_of(user)).first()
    return row.max_gpus if row else int(settings.SLICES_DEFAULT_GPU_QUOTA)


def cards_in_use(user: Any) -> int:
    return int(Instance.objects.for_team(user).live().aggregate(n=Sum("cards"))["n"] or 0)


def _lock_quota(user: Any) -> int:
    """Serialise one account's orders (the team's row, then the quota row, are the locks) and
    return its limit. The team's lock is the one ``console.teams.services.set_limits`` takes: a
    member's budget or card quota changed meanwhile applies to the next order at once."""
    Team.objects.select_for_update().filter(pk=team_of(user).pk).values_list("pk").first()
    row, _created = GpuQuota.objects.get_or_create(
        team=team_of(user), defaults={"max_gpus": int(settings.SLICES_DEFAULT_GPU_QUOTA)}
    )
    row = GpuQuota.objects.select_for_update().get(pk=row.pk)
    return row.max_gpus


def _ssh_key(user: Any, ref: str) -> tuple[str, str]:
    person = user_of(user)  # SSH keys are a person's, whichever team they act in
    if person is None and not ref:
        return "", ""
    try:
        key = (
            console_services.get_ssh_key_for_user(person, ref)
            if ref
            else console_services.get_default_ssh_key(person)
        )
    except Http404:  # unknown, or another customer's: the same answer
        raise OrderRefused(
            gettext_noop("Unknown SSH key %(ssh_key)s."), field="ssh_key", ssh_key=ref[:64]
        ) from None
    if key is None:
        return "", ""
    return key.name, key.public_key


@dataclass(frozen=True)
class _CheckedOrder:
    """An order that passed every check, with what the instance row is made of."""

    model: GpuModel
    region: Region | None
    name: str
    env: dict[str, str]
    per_hour: Decimal
    image: str
    container: str
    entrypoint: str
    mounts: list[dict[str, Any]]
    ssh: tuple[str, str]
    auto_release_at: datetime | None
    disks: Any
    web_ports: list[dict[str, Any]] = field(default_factory=list)
    slurm: slurm_service.SlurmOrder | None = None
    window: str = ""


def order_instance(
    user: Any,
    req: OrderRequest,
    *,
    idempotency_key: str | None = None,
    request: Any = None,
    audit_action: str = "instance.order",  # an app launch and the demo say which they were
) -> tuple[Instance, bool]:
    """Accept an order: check it, reserve its GPUs and start provisioning on commit.

    Returns (instance, created). The same ``idempotency_key`` with the same order returns the
    instance created the first time; with another order it is refused. Raises ``OrderRefused``,
    ``QuotaExceeded``, billing's ``InsufficientFunds``/``PriceNotSet``, marketplace's
    ``MountRefused`` or ``NoCapacity``; nothing is reserved or charged then.
    """
    fingerprint = req.fingerprint()
    if idempotency_key:
        existing = _replay(user, idempotency_key, fingerprint)
        if existing is not None:
            return existing, False
    checked = _check_order(user, req)
    try:
        with transaction.atomic():
            created = _create_and_allocate(user, req, checked, idempotency_key, fingerprint)
            disk_service.attach_for_order(created, checked.disks)
            audit.record(user, audit_action, created, after=_order_facts(created), request=request)
            return created, True
    except IntegrityError:
        # The same Idempotency-Key committed by a concurrent request first: answer with its result.
        if idempotency_key:
            existing = _replay(user, idempotency_key, fingerprint)
            if existing is not None:
                return existing, False
        raise


def _order_facts(instance: Instance) -> dict[str, Any]:
    """What the audit log keeps of an order: the cards, the model, the price quoted."""
    return {
        "gpu_model": instance.gpu_model.code,
        "cards": instance.cards,
        "billing_mode": instance.billing_mode,
        "per_hour": instance.quoted_per_hour,
    }


# What an order does when it cannot start now: refuse (NoCapacity, as always) or queue (排队).
WHEN_UNAVAILABLE = ("", "refuse", "queue")


def _check_shape(req: OrderRequest) -> None:
    """Card count, billing mode and release time make sense (before anything is looked up)."""
    if req.cards not in topology.HOST_SIZES and (
        req.cards <= 0 or req.cards % topology.SLICE_UNIT_GPUS
    ):
        raise OrderRefused(
            gettext_noop(
                "A host has 1, 2, 4 or 8 cards and a slice a multiple of 64, not %(cards)s."
            ),
            cards=req.cards,
        )
    if req.billing_mode not in BillingMode.values:
        raise OrderRefused(gettext_noop("Unknown billing mode %(mode)s."), mode=req.billing_mode)
    if req.auto_release_at is not None and req.auto_release_at <= timezone.now() + timedelta(
        minutes=1
    ):
        raise OrderRefused(gettext_noop("The automatic release time must be in the future."))
    if req.when_unavailable not in WHEN_UNAVAILABLE:
        raise OrderRefused(
            gettext_noop('"when_unavailable" is "refuse" or "queue", not %(value)s.'),
            field="when_unavailable",
            value=repr(req.when_unavailable)[:40],
        )
    if req.max_wait_hours is not None and not (
        0 < req.max_wait_hours <= settings.SLICES_QUEUE_MAX_WAIT_HOURS
    ):
        raise OrderRefused(
            gettext_noop("The maximum wait is more than 0 and at most %(hours)s hours."),
            field="max_wait_hours",
            hours=settings.SLICES_QUEUE_MAX_WAIT_HOURS,
        )


def _check_order(user: Any, req: OrderRequest) -> _CheckedOrder:
    """Every check of an order that needs no lock: model, region, shape, price and runway (a
    first look; decided again under the lock), image, mounts, SSH key. Raises the refusal;
    changes nothing."""
    model = resolve_gpu_model(req.gpu_model)
    region_code, order_disks = disk_service.resolve_for_order(user, req.disks, req.region)
    region = None
    if region_code:
        region = Region.objects.filter(code=region_code).first()
        if region is None:
            raise OrderRefused(gettext_noop("Unknown region %(region)s."), region=region_code)
    _check_shape(req)
    verification.require_verified_for_order(
        user_of(user), req.cards
    )  # 实名认证 for large slices (403)
    price = price_name(model.code)
    if price is None:
        raise billing.PriceNotSet(
            gettext_noop("No price is set for %(gpu_model)s yet; it cannot be ordered."),
            gpu_model=model.code,
        )
    if req.prepaid_until is None:
        _quote, per_hour = check_funds(user, price, req)
    else:  # a booked window, paid when booked: nothing to check, nothing charged per hour
        per_hour = Decimal("0.00")
    version = marketplace.resolve_image_version(req.image, model.code) if req.image else None
    if version is not None and not version.supports(model.code):
        raise OrderRefused(
            gettext_noop("The image %(image)s is not built for %(gpu_model)s."),
            field="image",
            image=str(version),
            gpu_model=model.code,
        )
    launch = (version.launch or {}) if version is not None else {}
    term = req.billing_mode == BillingMode.TERM and req.term_days
    return _CheckedOrder(
        model=model,
        region=region,
        name=_clean_name(req.name, f"{model.code}-{req.cards}"),
        env=_clean_env(req.env, req.platform_env),
        per_hour=per_hour,
        image=version.slug if version else "",
        container=version.container if version else "",
        entrypoint=req.entrypoint or str(launch.get("command", "")),
        mounts=[m.as_dict() for m in marketplace.build_mount_specs(user, list(req.asset_ids))],
        ssh=_ssh_key(user, req.ssh_key),
        auto_release_at=None if term else req.auto_release_at,  # a term sets it at running
        disks=order_disks,
        web_ports=ports.clean_web_ports(list(req.web_ports)),
        slurm=slurm_service.clean_order(req.cards, req.scheduler, req.job, req.release_on_job_end),
        window=req.window,
    )


def _replay(user: Any, key: str, fingerprint: str) -> Instance | None:
    existing = Instance.objects.filter(team=team_of(user), idempotency_key=key).first()
    if existing is None:
        return None
    if existing.request_fingerprint != fingerprint:
        raise OrderRefused(
            gettext_noop("This Idempotency-Key was used for a different order."),
            code=ErrorCode.IDEMPOTENCY_MISMATCH,
            http_status=422,
        )
    return existing


def _create_and_allocate(
    user: Any,
    req: OrderRequest,
    c: _CheckedOrder,
    idempotency_key: str | None,
    fingerprint: str,
) -> Instance:
    limit = _lock_quota(user)  # concurrent orders of one account queue here
    if req.prepaid_until is None:  # a booked window was checked and paid when booked
        used = cards_in_use(user)
        if used + req.cards > limit:
            raise quota_exceeded(limit, used, req.cards)
        # Decided here, under the lock: an order that committed while this one waited is counted.
        price = price_name(c.model.code) or c.model.code
        check_funds(user, price, req)
        check_member_limits(user, price, req)  # the member's card quota and monthly budget
    instance = Instance.objects.create(
        team=team_of(user),
        created_by=user_of(user),
        name=c.name,
        kind=AllocationKind.HOST if req.cards in topology.HOST_SIZES else AllocationKind.SLICE,
        gpu_model=c.model,
        cards=req.cards,
        region=c.region,
        image=c.image,
        container=c.container,
        entrypoint=c.entrypoint,
        mounts=c.mounts,
        env=c.env,
        ssh_key_name=c.ssh[0],
        ssh_public_key=c.ssh[1],
        billing_mode=req.billing_mode,
        term_days=req.term_days if req.billing_mode == BillingMode.TERM else None,
        quoted_per_hour=c.per_hour,
        auto_release_at=c.auto_release_at,
        term_paid_until=req.prepaid_until,  # a booked window: mark_running opens no session
        driver=settings.SLICES_DRIVER,
        idempotency_key=idempotency_key,
        request_fingerprint=fingerprint,
        web_ports=c.web_ports,
        access_token=ports.new_access_token(),
        app=req.app,
        app_model=req.app_model if req.app else "",
        app_api_key=ports.new_app_api_key() if req.app else "",
    )
    record_event(
        instance,
        EventKind.STATE,
        code="ordered",
        params={
            "cards": req.cards,
            "gpu_model": c.model.code,
            "user": person.get_username() if (person := user_of(user)) is not None else "",
        },
    )
    if c.slurm is not None:
        slurm_service.create_for_order(instance, c.slurm)  # its keys and ports (issue 31)
    if req.when_unavailable == "queue":
        if _queue_if_unavailable(instance, user, req, c):
            return instance
    else:
        _reserve(instance, user, c)
    enqueue_on_commit("slices.tasks.provision_instance_task", instance.pk)
    return instance


def _queue_if_unavailable(
    instance: Instance, user: Any, req: OrderRequest, c: _CheckedOrder
) -> bool:
    """排队: start now when nobody waits for this GPU model and region and it fits, else join
    the back of the queue (True). Holds no GPUs and costs nothing while queued; the team's
    number of queued orders is bounded (decided under the team's lock, ``_lock_quota``).
    Admission (``slices.services.queue``) starts it when the allocator's discipline lets it."""
    waiting = Instance.objects.filter(
        state=InstanceState.QUEUED, gpu_model=c.model, region=c.region
    ).exists()
    if not waiting:
        try:
            with transaction.atomic():  # a savepoint: a refusal keeps nothing of the attempt
                _reserve(instance, user, c)
            return False
        except NoCapacity as exc:
            if exc.reason_code != "no_capacity":
                raise  # it can never fit as ordered: refused, not queued
    bound = int(settings.SLICES_QUEUE_MAX_PER_TEAM)
    queued = Instance.objects.for_team(user).filter(state=InstanceState.QUEUED).count()
    if queued >= bound:
        raise QuotaExceeded(
            gettext_noop(
                "Your team may have %(bound)d queued orders at once; cancel one or order later."
            ),
            bound=bound,
            field="when_unavailable",
        )
    now = timezone.now()
    hours = req.max_wait_hours or float(settings.SLICES_QUEUE_DEFAULT_MAX_WAIT_HOURS)
    run = None
    if c.auto_release_at is not None:  # counted from the start, not from the order
        run = max(60, int((c.auto_release_at - now).total_seconds()))
    elif req.billing_mode == BillingMode.TERM and req.term_days:
        run = int(req.term_days) * 86400
    transition(
        instance,
        InstanceState.QUEUED,
        code="queued",
        params={"max_wait_hours": hours},
        queued_at=now,
        queue_deadline=now + timedelta(hours=hours),
        queue_run_seconds=run,
        auto_release_at=None,
    )
    enqueue_on_commit("slices.tasks.admit_queue_task", c.model.code)
    return True


def _reserve(instance: Instance, user: Any, c: _CheckedOrder) -> None:
    """allocating → provisioning: take the GPUs (compare-and-set on the nodes' masks)."""
    transition(instance, InstanceState.ALLOCATING, code="allocating")
    # NoCapacity propagates and rolls the whole order back: a loser keeps nothing.
    allocation = allocate(
        user,
        instance.cards,
        c.model.code,
        c.region.code if c.region else None,
        ends_at=c.auto_release_at,
        label=f"instance {instance.public_id}",
        window=c.window or None,
    )
    parts = list(allocation.nodes.select_related("node").order_by("rank"))
    InstanceNode.objects.bulk_create(
        [
            InstanceNode(
                instance=instance,
                node=p.node,
                rank=p.rank,
                hostname=p.node.hostname,
                gpu_mask=p.gpu_mask,
                step=lifecycle.Step.RESERVE,
            )
            for p in parts
        ]
    )
    pkey = (0x1000 + instance.pk % 0x6FFF) if allocation.kind == AllocationKind.SLICE else None
    transition(
        instance,
        InstanceState.PROVISIONING,
        code="allocated",
        params={"cards": instance.cards, "nodes": len(parts), "cluster": allocation.cluster.code},
        allocation=allocation,
        region=allocation.cluster.region,
        partition_key=pkey,
    )


def instance_costs(instances: Iterable[Instance]) -> dict[int, Decimal]:
    """What each instance has cost so far, by instance pk, as billing counts it (its services).

    On demand: what billing charged for each of its runs (usage sessions), the open one to this
    second on billing's clock, so a stopped and restarted instance shows all its runs and a
    无卡模式 run (no GPU session) adds nothing. A locked-price term: what was paid for it up front.
    """
    instances = list(instances)
    by_id = {str(i.public_id): i.pk for i in instances}
    # Only an instance ordered on a term holds one (its billing mode never changes).
    termed = [str(i.public_id) for i in instances if i.billing_mode == BillingMode.TERM]
    costs = billing.costs_so_far(INSTANCE_RESOURCE, by_id, termed=termed)
    return {pk: costs[public_id] for public_id, pk in by_id.items()}


def instance_cost(instance: Instance) -> Decimal:
    """What the instance has cost so far (``instance_costs`` for one)."""
    return instance_costs([instance])[instance.pk]


# ---------------------------------------------------------------------------------------------
# Release and failure
# ---------------------------------------------------------------------------------------------


def close_billing(instance: Instance, reason: str, *, code: str = "billing_closed") -> None:
    """Stop billing the instance's GPUs now; what was settled goes in an event (``code``)."""
    session = billing.close_usage_session(INSTANCE_RESOURCE, str(instance.public_id), reason=reason)
    if session is not None:
        record_event(
            instance,
            EventKind.STATE,
            code=code,
            params={"seconds": session.settled_seconds, "amount": str(session.charged)},
        )


@transaction.atomic
def release_instance(
    instance: Instance,
    *,
    by: str,
    code: str = "release_requested",
    who: Any = None,
    request: Any = None,
) -> bool:
    """Release with one click: billing stops now, the nodes are cleaned and the GPUs freed by a
    worker. Idempotent: True only for the call that started the release. ``who`` is the person
    (None: the console itself, ``by`` says why) for the audit log."""
    before = {"state": instance.state}
    if instance.state == InstanceState.QUEUED:
        # A queued order holds nothing and was charged nothing: cancelling it is free.
        won = transition(
            instance,
            InstanceState.RELEASED,
            code="queue_cancelled",
            params={"by": by},
            ended_at=timezone.now(),
            start_estimate={},
        )
        if won:
            _audit_release(who, instance, before, by, request)
            enqueue_on_commit("slices.tasks.admit_queue_task", instance.gpu_model.code)
        return won
    if instance.state == InstanceState.FAILED:
        # Its resources were freed when it failed: releasing only archives it.
        won = transition(
            instance,
            InstanceState.RELEASED,
            code=code,
            params={"by": by},
            ended_at=instance.ended_at or timezone.now(),
        )
        if won:
            _audit_release(who, instance, before, by, request)
        return won
    if not transition(instance, InstanceState.RELEASING, code=code, params={"by": by}):
        return False
    _audit_release(who, instance, before, by, request)
    close_billing(instance, "released")
    _storage_released(instance)
    enqueue_on_commit("slices.tasks.teardown_instance_task", instance.pk)
    return True


def _audit_release(who: Any, instance: Instance, before: dict, by: str, request: Any) -> None:
    after = {"state": instance.state, "by": by}
    audit.record(who, "instance.release", instance, before=before, after=after, request=request)


@transaction.atomic
def fail_instance(instance: Instance, code: str, params: dict[str, Any] | None = None) -> bool:
    """Mark failed with a reason (code + parameters); billing stops and a worker frees the nodes."""
    reason = {"code": code, "params": params or {}}
    if not transition(
        instance,
        InstanceState.FAILED,
        code="failed",
        params={"reason": reason},
        level=EventLevel.ERROR,
        failure_code=code,
        failure_params=params or {},
        ended_at=timezone.now(),
    ):
        return False
    close_billing(instance, "failed")
    _storage_released(instance)
    enqueue_on_commit("slices.tasks.teardown_instance_task", instance.pk)
    return True


def _storage_released(instance: Instance) -> None:
    """The instance's disks stay (detached) and a kept system disk stops being billed."""
    disk_service.detach_all(instance)
    disk_service.sync_storage_billing(instance.team)


@transaction.atomic
def finish_teardown(instance: Instance) -> bool:
    """After the nodes were cleaned: free the GPUs once, and end a release."""
    won = (
        Instance.objects.filter(pk=instance.pk, resources_freed_at__isnull=True).update(
            resources_freed_at=timezone.now()
        )
        == 1
    )
    if won and instance.allocation_id:
        release_allocation(Allocation.objects.get(pk=instance.allocation_id))
    if won:
        access.clear_ssh_ports(instance)  # its nodes were cleaned: their sshd ports are free
        access.clear_gateway_port(instance)  # released or failed: its public port too
    instance.refresh_from_db()
    if instance.state == InstanceState.RELEASING:
        return transition(
            instance, InstanceState.RELEASED, code="released", ended_at=timezone.now()
        )
    if won and instance.state == InstanceState.FAILED:
        record_event(instance, EventKind.STATE, code="resources_freed")
        events.broadcast_state_on_commit(instance)
    return won


def stop_for_billing(resource_kind: str, resource_id: str, reason: str) -> bool:
    """Billing stopped an instance's usage (balance ran out): release it through the same service."""
    pid = parse_uuid(resource_id)
    instance = Instance.objects.filter(public_id=pid).first() if pid else None
    if instance is None:
        return False
    with transaction.atomic():
        if not transition(
            instance,
            InstanceState.RELEASING,
            code="billing_stopped",
            params={"reason": reason},
            level=EventLevel.WARNING,
        ):
            return False
        enqueue_on_commit("slices.tasks.teardown_instance_task", instance.pk)
    return True
