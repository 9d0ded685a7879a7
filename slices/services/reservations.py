"""Booked windows (预约, issue 32): book, price, cancel, the capacity calendar, and the start.

* ``book_reservation(who, BookingRequest)`` — checks the request (400 with the field at fault),
  the verification gate, the price (the term ladder's rate for the window's length, locked), and
  plans the window on the fleet as it will be at its start (``slices.topology.windows.pin``);
  the GPUs it would get are its *pins*, held from then on in every plan that overlaps the window.
  Paid up front through billing in the same transaction (``billing.pay_reservation``). Bookings
  of one GPU model are decided one at a time under that model's row lock, so two bookings never
  both take the last capacity of a window.
* ``cancel_reservation(who, public_id)`` — the rule stated at booking, applied exactly: all back
  until 24 h before the start, half after, nothing once it started (``billing.pricing.
  reservation_refund_share``). Compare-and-set on the row under its lock; the refund's ledger key
  is unique per window, so a double cancel refunds once.
* ``run_reservations(now)`` — what beat runs every minute: the T−24 h and T−1 h notices (each
  once), covering a pinned node that failed with another (re-pinning), and at the start minus the
  provisioning lead (``slices.eta``'s first estimate, doubled, at least ten minutes) the start:
  an ``Instance`` ordered for the team through ``order_instance`` with ``prepaid_until`` = the
  window's end, so billing opens no per-second session for it, released automatically at the
  window's end. When no GPUs are free (a node failed and nothing covers it) the window is
  *delayed*: told once, retried every minute, and the time it starts late is refunded.
* ``capacity_calendar(gpu_model, region, days)`` — per day, what a window could book.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone
from django.utils.translation import gettext_noop

from billing import services as billing
from billing.money import round_cents
from console.audit import services as audit
from console.errors import DomainError, ErrorCode
from console.ids import parse_uuid
from console.notices import services as notices
from console.tenancy import for_row, team_of, user_of
from console.verification import services as verification
from slices import topology
from slices.choices import RESERVATION_HOLDING, InstanceState, ReservationState
from slices.models import GpuModel, Instance, Region, Reservation
from slices.services.allocation import NoCapacity
from slices.services.eta import first_estimate
from slices.services.fleet import build_fleet
from slices.services.instances import (
    OrderRefused,
    OrderRequest,
    order_instance,
    price_name,
    release_instance,
    resolve_gpu_model,
)
from slices.services.windows import as_window, booked_windows
from slices.topology import windows as booked

logger = logging.getLogger(__name__)

MAX_DAYS_AHEAD = 90
MAX_HOURS = MAX_DAYS_AHEAD * 24
MIN_LEAD_SECONDS = 600  # a window is prepared at least this long before its start


class ReservationRefused(DomainError):
    code = ErrorCode.INVALID
    http_status = 400


@dataclass(frozen=True)
class BookingRequest:
    """A window as the form or the API gives it."""

    gpu_model: str
    cards: int
    region: str
    starts_at: datetime
    hours: int
    image: str = ""
    name: str = ""


def get_reservation_for_user(who: Any, public_id: Any) -> Reservation:
    """The team's window (404 for anyone else's, or a malformed id)."""
    pk = parse_uuid(str(public_id))
    row = (
        Reservation.objects.for_team(who)
        .select_related("gpu_model", "region", "instance")
        .filter(public_id=pk)
        .first()
        if pk
        else None
    )
    if row is None:
        raise Http404("no such reservation")
    return row


def provisioning_lead(model: GpuModel, cards: int) -> int:
    """Seconds before a window's start its provisioning begins: the ETA model's first estimate
    for this size (history, else the driver's step times), doubled for its spread, at least
    ``MIN_LEAD_SECONDS``."""
    nodes = max(1, cards // 8) if cards >= topology.SLICE_UNIT_GPUS else 1
    estimate = first_estimate(
        settings.SLICES_DRIVER, model.pk, nodes, slice_=cards >= topology.SLICE_UNIT_GPUS
    )
    return max(MIN_LEAD_SECONDS, math.ceil(2 * estimate.exact))


# ---------------------------------------------------------------------------------------------
# Checking and pricing
# ---------------------------------------------------------------------------------------------


def check_booking(req: BookingRequest, now: datetime | None = None) -> tuple[GpuModel, Region]:
    """Every check that needs no lock; raises ``ReservationRefused`` naming the field at fault."""
    now = now or timezone.now()
    try:
        model = resolve_gpu_model(req.gpu_model)
    except OrderRefused:
        raise ReservationRefused(
            gettext_noop("Unknown GPU model %(gpu_model)s."),
            field="gpu_model",
            gpu_model=str(req.gpu_model)[:40],
        ) from None
    region = Region.objects.filter(code=req.region).first()
    if region is None:
        raise ReservationRefused(
            gettext_noop("Unknown region %(region)s."), field="region", region=str(req.region)[:40]
        )
    if req.cards not in topology.HOST_SIZES and (
        req.cards <= 0 or req.cards % topology.SLICE_UNIT_GPUS
    ):
        raise ReservationRefused(
            gettext_noop(
                "A host has 1, 2, 4 or 8 cards and a slice a multiple of 64, not %(cards)s."
            ),
            field="cards",
            cards=req.cards,
        )
    if req.hours < 1 or req.hours > MAX_HOURS:
        raise ReservationRefused(
            gettext_noop("A window lasts from 1 to %(max)s hours."), field="hours", max=MAX_HOURS
        )
    if req.starts_at <= now + timedelta(seconds=MIN_LEAD_SECONDS):
        raise ReservationRefused(
            gettext_noop("A window starts at least %(minutes)s minutes from now."),
            field="starts_at",
            minutes=MIN_LEAD_SECONDS // 60,
        )
    if req.starts_at > now + timedelta(days=MAX_DAYS_AHEAD):
        raise ReservationRefused(
            gettext_noop("A window starts at most %(days)s days ahead."),
            field="starts_at",
            days=MAX_DAYS_AHEAD,
        )
    return model, region


def quote_window(req: BookingRequest) -> billing.WindowPrice:
    """The locked price of a window (the term ladder's rate for its length); raises the
    refusal of a bad request or billing's ``PriceNotSet``."""
    model, _region = check_booking(req)
    name = price_name(model.code)
    if name is None:
        raise billing.PriceNotSet(
            gettext_noop("No price is set for %(model)s yet; it cannot be booked."),
            model=model.code,
        )
    return billing.window_price(name, req.cards, req.hours)


def _plan_window(
    model: GpuModel, region: Region, cards: int, starts_at: datetime, ends_at: datetime, lead: int
) -> topology.Placement | topology.Unplaceable:
    """Where the window would sit at its start, beside the leases still running then and the
    other booked windows (a fresh snapshot: the plan changes it)."""
    fleet, _nodes = build_fleet(model.code, with_nodes=False)
    start = starts_at.timestamp()
    req = topology.Request(
        f"plan:{uuid.uuid4()}", cards, model.code, region.code, start - lead, ends_at.timestamp()
    )
    return booked.pin(
        fleet,
        req,
        booked_windows(model.code),
        starts_at=start,
        ends_at=ends_at.timestamp(),
        lead=lead,
    )


def _pins(placement: topology.Placement) -> list[list[Any]]:
    return [[s.hostname, list(s.gpus)] for s in placement.shares]


# ---------------------------------------------------------------------------------------------
# Booking and cancelling
# ---------------------------------------------------------------------------------------------


def book_reservation(
    who: Any,
    req: BookingRequest,
    *,
    idempotency_key: str | None = None,
    request: Any = None,
) -> tuple[Reservation, bool]:
    """Book and pay a window; (row, created). Raises ``ReservationRefused`` (400, its field),
    ``NoCapacity``-like 409 when the window does not fit, billing's ``InsufficientFunds`` or
    ``PriceNotSet``, or the verification gate's 403; nothing is held or charged then."""
    if idempotency_key:
        done = Reservation.objects.for_team(who).filter(idempotency_key=idempotency_key).first()
        if done is not None:
            return done, False
    model, region = check_booking(req)
    verification.require_verified_for_order(user_of(who), req.cards)  # 实名认证 for large slices
    priced = quote_window(req)  # PriceNotSet before anything is locked
    ends_at = req.starts_at + timedelta(hours=req.hours)
    lead = provisioning_lead(model, req.cards)
    try:
        with transaction.atomic():
            # One booking of a GPU model at a time: the window's capacity is decided under this
            # lock, so two concurrent bookings never both count the same free GPUs.
            GpuModel.objects.select_for_update().filter(pk=model.pk).values_list("pk").first()
            planned = _plan_window(model, region, req.cards, req.starts_at, ends_at, lead)
            if isinstance(planned, topology.Unplaceable):
                raise ReservationRefused(
                    gettext_noop(
                        "%(cards)s × %(gpu_model)s in %(region)s cannot be booked from "
                        "%(starts_at)s for %(hours)s h: the capacity calendar shows what can."
                    ),
                    code=ErrorCode.NO_CAPACITY,
                    http_status=409,
                    field="starts_at",
                    cards=req.cards,
                    gpu_model=model.code,
                    region=region.display_name,
                    starts_at=timezone.localtime(req.starts_at).strftime("%Y-%m-%d %H:%M"),
                    hours=req.hours,
                )
            row = Reservation.objects.create(
                team=team_of(who),
                created_by=user_of(who),
                name=(req.name or f"{model.code}-{req.cards}")[:63],
                gpu_model=model,
                region=region,
                cards=req.cards,
                image=req.image[:120],
                starts_at=req.starts_at,
                hours=req.hours,
                ends_at=ends_at,
                rate_per_card_hour=priced.rate_per_card_hour,
                term_days=priced.term_days,
                total=priced.total,
                pins=_pins(planned),
                provision_lead_seconds=lead,
                idempotency_key=idempotency_key,
            )
            billing.pay_reservation(
                who,
                gpu_model=priced.gpu_model,
                cards=req.cards,
                hours=req.hours,
                resource_id=str(row.public_id),
                name=row.name,
            )
            audit.record(
                who,
                "reservation.book",
                row,
                after={"cards": row.cards, "gpu_model": model.code, "total": row.total},
                request=request,
            )
            return row, True
    except IntegrityError:
        if idempotency_key:  # the same key committed by a concurrent request first
            done = Reservation.objects.for_team(who).filter(idempotency_key=idempotency_key).first()
            if done is not None:
                return done, False
        raise


def refund_due(row: Reservation, now: datetime) -> Decimal:
    """What cancelling ``row`` at ``now`` gives back (the rule stated at booking)."""
    share = billing.reservation_refund_share((row.starts_at - now).total_seconds())
    return round_cents(row.total * share)


def cancel_reservation(
    who: Any, public_id: Any, *, request: Any = None, now: datetime | None = None
) -> tuple[Reservation, Decimal]:
    """Cancel a window; (row, refunded now). Idempotent and race-safe: the row's lock and a
    compare-and-set decide one cancel; a second finds it cancelled and refunds nothing."""
    row = get_reservation_for_user(who, public_id)
    with transaction.atomic():
        row = Reservation.objects.select_for_update().get(pk=row.pk)
        now = now or timezone.now()
        if row.state not in (*RESERVATION_HOLDING, ReservationState.STARTED):
            return row, Decimal("0.00")  # already cancelled, ended or missed: nothing again
        share = billing.reservation_refund_share((row.starts_at - now).total_seconds())
        amount = min(round_cents(row.total * share), row.total - row.refunded)
        won = (
            Reservation.objects.filter(pk=row.pk, state=row.state).update(
                state=ReservationState.CANCELLED, cancelled_at=now
            )
            == 1
        )
        if not won:
            return row, Decimal("0.00")
        txn = billing.refund_reservation(
            for_row(row),
            resource_id=str(row.public_id),
            amount=amount,
            why="cancelled",
            share=share,
            name=row.name,
        )
        refunded = amount if txn is not None else Decimal("0.00")
        if refunded:
            Reservation.objects.filter(pk=row.pk).update(refunded=row.refunded + refunded)
        audit.record(
            who,
            "reservation.cancel",
            row,
            after={"refunded": refunded, "share": str(share)},
            request=request,
        )
        instance = row.instance
        if instance is not None and instance.state not in (
            InstanceState.RELEASED,
            InstanceState.RELEASING,
            InstanceState.FAILED,
        ):
            release_instance(instance, by="reservation_cancelled", who=who, request=request)
    row.refresh_from_db()
    return row, refunded


# ---------------------------------------------------------------------------------------------
# The capacity calendar
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CalendarDay:
    date: str  # ISO date in the console's time zone
    free_gpus: int
    total_gpus: int
    largest_host: int
    largest_slice: int

    @property
    def share(self) -> float:
        return self.free_gpus / self.total_gpus if self.total_gpus else 0.0


def capacity_calendar(gpu_model: str, region: str, days: int = MAX_DAYS_AHEAD) -> list[CalendarDay]:
    """What can be booked per day (1 to ``days`` days ahead, from tomorrow) in ``region`` of
    ``gpu_model``: free GPUs beside the leases still running and the windows booked, the largest
    host and slice a whole-day window could get. Raises ``ReservationRefused`` for an unknown
    model or region."""
    model, reg = check_booking(
        BookingRequest(gpu_model, 1, region, timezone.now() + timedelta(days=1), 1)
    )
    days = max(1, min(MAX_DAYS_AHEAD, int(days)))
    today = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    first = today + timedelta(days=1)
    fleet, _nodes = build_fleet(model.code, with_nodes=False)
    rows = booked.calendar(
        fleet,
        booked_windows(model.code),
        gpu_model=model.code,
        region=reg.code,
        first_day=first.timestamp(),
        days=days,
        lead=MIN_LEAD_SECONDS,
    )
    return [
        CalendarDay(
            (first + timedelta(days=r.day)).date().isoformat(),
            r.free_gpus,
            r.total_gpus,
            r.largest_host,
            r.largest_slice,
        )
        for r in rows
    ]


# ---------------------------------------------------------------------------------------------
# What beat runs: notices, covering failed nodes, the start
# ---------------------------------------------------------------------------------------------


def _notice_params(row: Reservation) -> dict[str, Any]:
    return {
        "name": row.name,
        "cards": row.cards,
        "gpu_model": row.gpu_model.code,
        "region": row.region.display_name,
        "starts_at": timezone.localtime(row.starts_at).strftime("%Y-%m-%d %H:%M"),
        "ends_at": timezone.localtime(row.ends_at).strftime("%Y-%m-%d %H:%M"),
    }


def _warn(row: Reservation, field: str, tag: str, now: datetime) -> bool:
    """Send the T−24 h or T−1 h notice once: the compare-and-set of its field decides."""
    won = Reservation.objects.filter(pk=row.pk, **{f"{field}__isnull": True}).update(**{field: now})
    if won:
        notices.notify_user_id(
            row.created_by_id,
            "reservation_soon",
            _notice_params(row),
            key=f"reservation:{row.public_id}:{tag}",
            link="/reservations/",
        )
    return bool(won)


def _pins_usable(row: Reservation, fleet: topology.Fleet) -> bool:
    for hostname, _idxs in row.pins or ():
        gid = fleet.gid_by_hostname.get(hostname)
        if gid is None or not fleet.node_ok[gid]:
            return False
    return True


def cover_failed_pins(now: datetime | None = None) -> int:
    """Windows whose pins sit on a node out of service are planned again (covered by another
    node); how many were. A window nothing covers keeps its pins and is told at its start."""
    now = now or timezone.now()
    moved = 0
    rows = Reservation.objects.filter(state__in=RESERVATION_HOLDING, starts_at__gt=now)
    for model_id in rows.values_list("gpu_model_id", flat=True).distinct():
        with transaction.atomic():
            GpuModel.objects.select_for_update().filter(pk=model_id).values_list("pk").first()
            fleet, _nodes = build_fleet(GpuModel.objects.get(pk=model_id).code, with_nodes=False)
            for row in rows.filter(gpu_model_id=model_id).select_related("gpu_model", "region"):
                if _pins_usable(row, fleet):
                    continue
                others = booked_windows(row.gpu_model.code, exclude=str(row.public_id))
                planned = booked.pin(
                    build_fleet(row.gpu_model.code, with_nodes=False)[0],
                    topology.Request(
                        f"repin:{row.public_id}",
                        row.cards,
                        row.gpu_model.code,
                        row.region.code,
                        row.starts_at.timestamp() - row.provision_lead_seconds,
                        row.ends_at.timestamp(),
                    ),
                    others,
                    starts_at=row.starts_at.timestamp(),
                    ends_at=row.ends_at.timestamp(),
                    lead=row.provision_lead_seconds,
                )
                if isinstance(planned, topology.Placement):
                    Reservation.objects.filter(pk=row.pk).update(pins=_pins(planned))
                    moved += 1
    return moved


def start_reservation(row: Reservation, now: datetime | None = None) -> Instance | None:
    """Order the window's instance (prepaid to its end, released at its end) if it is due;
    None when it is not (yet) started: not due, taken by another worker, or no GPUs free
    (then delayed: told once, retried by the next run, the late time refunded at the start)."""
    now = now or timezone.now()
    with transaction.atomic():
        row = (
            Reservation.objects.select_for_update()
            .select_related("gpu_model", "region", "team", "created_by")
            .get(pk=row.pk)
        )
        if row.state not in RESERVATION_HOLDING or row.provision_at > now:
            return None
        if now >= row.ends_at:  # the whole window passed without GPUs: all of it comes back
            Reservation.objects.filter(pk=row.pk).update(state=ReservationState.MISSED)
            _refund(row, row.total - row.refunded, "missed", Decimal(1))
            return None
        order = OrderRequest(
            gpu_model=row.gpu_model.code,
            cards=row.cards,
            name=row.name,
            region=row.region.code,
            image=row.image,
            auto_release_at=row.ends_at,
            window=str(row.public_id),
            prepaid_until=row.ends_at,
        )
        try:
            with transaction.atomic():
                instance, _created = order_instance(
                    for_row(row),
                    order,
                    idempotency_key=f"reservation:{row.public_id}",
                    audit_action="instance.order",
                )
        except (NoCapacity, DomainError) as exc:
            logger.warning("window %s cannot start yet: %s", row.public_id, exc.template)
            if row.state != ReservationState.DELAYED or row.delay_noted_at is None:
                Reservation.objects.filter(pk=row.pk).update(
                    state=ReservationState.DELAYED, delay_noted_at=now
                )
                notices.notify_user_id(
                    row.created_by_id,
                    "reservation_delayed",
                    _notice_params(row),
                    key=f"reservation:{row.public_id}:delayed",
                    link="/reservations/",
                )
            return None
        Reservation.objects.filter(pk=row.pk).update(
            state=ReservationState.STARTED, instance=instance, started_at=now
        )
        late = (now - row.provision_at).total_seconds()
        if row.state == ReservationState.DELAYED and late > 0:
            # The delay is not billed: the share of the window it ate comes back.
            share = Decimal(min(1.0, late / (row.hours * 3600))).quantize(Decimal("0.0001"))
            _refund(row, round_cents(row.total * share), "delay", share)
        return instance


def _refund(row: Reservation, amount: Decimal, why: str, share: Decimal) -> None:
    amount = min(amount, row.total - row.refunded)
    if amount <= 0:
        return
    txn = billing.refund_reservation(
        for_row(row),
        resource_id=str(row.public_id),
        amount=amount,
        why=why,
        share=share,
        name=row.name,
    )
    if txn is not None:
        Reservation.objects.filter(pk=row.pk).update(refunded=row.refunded + amount)


@dataclass(frozen=True)
class SweepResult:
    warned: int = 0
    covered: int = 0
    started: int = 0
    delayed: int = 0
    ended: int = 0


def run_reservations(now: datetime | None = None) -> SweepResult:
    """One beat of the windows: notices at T−24 h and T−1 h, failed pins covered, due windows
    started, started windows past their end marked ended (their instance releases itself at
    ``auto_release_at``). Safe to run twice and from two workers: every step is a
    compare-and-set."""
    now = now or timezone.now()
    warned = 0
    soon = Reservation.objects.filter(state__in=RESERVATION_HOLDING, starts_at__gt=now)
    for row in soon.filter(starts_at__lte=now + timedelta(hours=24), warned_day_at__isnull=True):
        warned += _warn(row, "warned_day_at", "day", now)
    for row in soon.filter(starts_at__lte=now + timedelta(hours=1), warned_hour_at__isnull=True):
        warned += _warn(row, "warned_hour_at", "hour", now)
    covered = cover_failed_pins(now)
    started = delayed = 0
    due = Reservation.objects.filter(
        state__in=RESERVATION_HOLDING, starts_at__lte=now + timedelta(days=1)
    ).order_by("starts_at")
    for row in due:
        if row.provision_at > now:
            continue
        if start_reservation(row, now) is not None:
            started += 1
        else:
            delayed += 1
    ended = Reservation.objects.filter(state=ReservationState.STARTED, ends_at__lte=now).update(
        state=ReservationState.ENDED
    )
    return SweepResult(warned, covered, started, delayed, ended)


__all__ = [
    "BookingRequest",
    "CalendarDay",
    "ReservationRefused",
    "SweepResult",
    "as_window",
    "book_reservation",
    "cancel_reservation",
    "capacity_calendar",
    "check_booking",
    "get_reservation_for_user",
    "provisioning_lead",
    "quote_window",
    "refund_due",
    "run_reservations",
    "start_reservation",
]
