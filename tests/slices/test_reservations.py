"""Booked windows (预约, issue 32): price, refund rule at each boundary, double cancel, capacity
never oversubscribed, the allocator honouring windows, the start, a node failure before it."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import services as billing
from billing.choices import MemoCode, TransactionKind
from billing.models import LedgerTransaction, UsageSession
from billing.pricing import GpuPrice, TermPrice, reservation_refund_share, window_rate
from console.notices.models import Notice
from slices import services
from slices.choices import InstanceState, NodeHealth, NodeState, ReservationState
from slices.models import Instance, Node, Reservation
from slices.services import reservations
from slices.services.allocation import NoCapacity, claim_on_node, claim_replacement

pytestmark = pytest.mark.django_db


def _req(**kw):
    values = {
        "gpu_model": "RTX4090",
        "cards": 8,
        "region": "xiamen",
        "starts_at": timezone.now() + timedelta(days=2),
        "hours": 24,
    }
    values.update(kw)
    return reservations.BookingRequest(**values)


def _spendable(user) -> Decimal:
    return billing.get_wallet_summary(user).spendable


# --- the price and the rule (pure) -----------------------------------------------------------------


def test_the_term_ladder_gives_the_rate_for_the_windows_length() -> None:
    price = GpuPrice(
        "RTX 4090",
        Decimal("1.90"),
        (
            TermPrice(1, Decimal("1.80")),
            TermPrice(7, Decimal("1.60")),
            TermPrice(30, Decimal("1.20")),
        ),
    )
    assert window_rate(price, 23) == (Decimal("1.90"), None)
    assert window_rate(price, 24) == (Decimal("1.80"), 1)
    assert window_rate(price, 7 * 24 - 1) == (Decimal("1.80"), 1)
    assert window_rate(price, 7 * 24) == (Decimal("1.60"), 7)
    assert window_rate(price, 90 * 24) == (Decimal("1.20"), 30)


def test_the_refund_rule_at_each_boundary() -> None:
    day = 24 * 3600
    assert reservation_refund_share(day + 1) == 1
    assert reservation_refund_share(day) == 1  # "until 24 h before": inclusive
    assert reservation_refund_share(day - 1) == Decimal("0.5")
    assert reservation_refund_share(1) == Decimal("0.5")
    assert reservation_refund_share(0) == 0  # started
    assert reservation_refund_share(-3600) == 0


# --- booking -------------------------------------------------------------------------------------


def test_booking_pays_the_locked_price_through_the_ledger(sim_fleet, funded) -> None:
    before = _spendable(funded)
    row, created = reservations.book_reservation(funded, _req())
    assert created
    assert row.rate_per_card_hour == Decimal("1.80") and row.term_days == 1
    assert row.total == Decimal("345.60")  # 1.80 × 8 cards × 24 h
    assert _spendable(funded) == before - Decimal("345.60")
    txn = LedgerTransaction.objects.get(idempotency_key=f"reservation:{row.public_id}")
    assert txn.kind == TransactionKind.TERM_PURCHASE and txn.memo_code == MemoCode.RESERVATION
    assert len(row.pins) == 1 and len(row.pins[0][1]) == 8
    assert billing.reconcile() == []


def test_booking_without_funds_changes_nothing(sim_fleet, alice) -> None:
    with pytest.raises(billing.InsufficientFunds):
        reservations.book_reservation(alice, _req())
    assert not Reservation.objects.exists()
    assert not LedgerTransaction.objects.filter(memo_code=MemoCode.RESERVATION).exists()


def test_the_idempotency_key_books_once(sim_fleet, funded) -> None:
    a, created_a = reservations.book_reservation(funded, _req(), idempotency_key="k1")
    b, created_b = reservations.book_reservation(funded, _req(), idempotency_key="k1")
    assert created_a and not created_b and a.pk == b.pk
    assert Reservation.objects.count() == 1


def test_bookings_never_oversubscribe_a_windows_capacity(sim_fleet, funded) -> None:
    """Xiamen has 2 × 8 RTX 4090: two 8-card windows fit, a third overlapping one does not,
    one that starts after them does."""
    start = timezone.now() + timedelta(days=3)
    reservations.book_reservation(funded, _req(starts_at=start))
    reservations.book_reservation(funded, _req(starts_at=start + timedelta(hours=5)))
    paid = _spendable(funded)
    with pytest.raises(reservations.ReservationRefused) as refused:
        reservations.book_reservation(funded, _req(starts_at=start + timedelta(hours=10)))
    assert refused.value.http_status == 409
    assert _spendable(funded) == paid  # refused: nothing charged
    later = start + timedelta(hours=30)  # both earlier windows ended
    reservations.book_reservation(funded, _req(starts_at=later))
    assert Reservation.objects.count() == 3


# --- cancelling ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before_start", "share"),
    [
        (timedelta(hours=24, seconds=1), Decimal("1")),
        (timedelta(hours=24), Decimal("1")),
        (timedelta(hours=24) - timedelta(seconds=1), Decimal("0.5")),
        (timedelta(seconds=1), Decimal("0.5")),
        (timedelta(0), Decimal("0")),
    ],
)
def test_cancel_refunds_by_the_rule(sim_fleet, funded, before_start, share) -> None:
    row, _ = reservations.book_reservation(funded, _req())
    paid = _spendable(funded)
    row, refunded = reservations.cancel_reservation(
        funded, row.public_id, now=row.starts_at - before_start
    )
    assert refunded == (row.total * share).quantize(Decimal("0.01"))
    assert _spendable(funded) == paid + refunded
    assert row.state == ReservationState.CANCELLED and row.refunded == refunded
    assert billing.reconcile() == []


def test_a_double_cancel_refunds_once_and_shows_in_the_statement(
    sim_fleet, funded, alice_client
) -> None:
    row, _ = reservations.book_reservation(funded, _req())
    _row, first = reservations.cancel_reservation(funded, row.public_id)
    _row, second = reservations.cancel_reservation(funded, row.public_id)
    assert first == row.total and second == 0
    refunds = LedgerTransaction.objects.filter(memo_code=MemoCode.RESERVATION_REFUND)
    assert refunds.count() == 1 and refunds.get().kind == TransactionKind.REFUND
    page = alice_client.get("/billing/", HTTP_ACCEPT_LANGUAGE="en")
    assert "Refund of booked window" in page.content.decode()


# --- the allocator honours windows ---------------------------------------------------------------


def test_an_on_demand_order_goes_elsewhere_or_ends_before_the_window(sim_fleet, funded) -> None:
    """Both RTX 4090 nodes booked from T: an open-ended order is refused with 可用至 (when it
    would have to end); one released before the window starts now."""
    start = timezone.now() + timedelta(days=1)
    reservations.book_reservation(funded, _req(starts_at=start, cards=8))
    reservations.book_reservation(funded, _req(starts_at=start, cards=8))
    with pytest.raises(NoCapacity) as refused:
        services.order_instance(funded, services.OrderRequest(gpu_model="RTX4090", cards=1))
    until = refused.value.available_until
    assert until is not None and until <= start
    assert refused.value.as_body()["reason"] == "reserved"
    instance, _ = services.order_instance(
        funded,
        services.OrderRequest(
            gpu_model="RTX4090", cards=1, auto_release_at=until - timedelta(minutes=5)
        ),
    )
    assert instance.allocation is not None


def test_a_window_leaves_other_nodes_to_on_demand(sim_fleet, funded) -> None:
    reservations.book_reservation(funded, _req(cards=8))
    pinned = {h for h, _g in Reservation.objects.get().pins}
    instance, _ = services.order_instance(
        funded, services.OrderRequest(gpu_model="RTX4090", cards=8)
    )
    assert {p.node.hostname for p in instance.allocation.nodes.all()}.isdisjoint(pinned)


# --- the start, notices, a node failure ----------------------------------------------------------


def test_a_due_window_starts_as_a_prepaid_instance(
    sim_fleet, funded, django_capture_on_commit_callbacks
) -> None:
    row, _ = reservations.book_reservation(funded, _req())
    with django_capture_on_commit_callbacks(execute=True):
        result = reservations.run_reservations(now=row.provision_at)
    assert result.started == 1
    row.refresh_from_db()
    instance = Instance.objects.get(pk=row.instance_id)
    assert row.state == ReservationState.STARTED
    assert instance.term_paid_until == row.ends_at and instance.auto_release_at == row.ends_at
    assert instance.state == InstanceState.RUNNING
    # Paid when booked: no per-second session bills the window.
    assert not UsageSession.objects.filter(resource_id=str(instance.public_id)).exists()
    # A second run starts nothing twice.
    assert reservations.run_reservations(now=row.provision_at).started == 0


def test_notices_at_24_h_and_1_h_are_sent_once(sim_fleet, funded) -> None:
    row, _ = reservations.book_reservation(funded, _req())
    reservations.run_reservations(now=row.starts_at - timedelta(hours=23))
    reservations.run_reservations(now=row.starts_at - timedelta(hours=22))
    assert Notice.objects.filter(event="reservation_soon").count() == 1
    reservations.run_reservations(now=row.starts_at - timedelta(minutes=59))
    reservations.run_reservations(now=row.starts_at - timedelta(minutes=58))
    assert Notice.objects.filter(event="reservation_soon").count() == 2


def test_a_failed_pinned_node_is_covered_by_another(sim_fleet, funded) -> None:
    row, _ = reservations.book_reservation(funded, _req())
    [[host, _gpus]] = row.pins
    Node.objects.filter(hostname=host).update(state=NodeState.FAILED, health=NodeHealth.UNREACHABLE)
    reservations.run_reservations(now=row.starts_at - timedelta(hours=30))
    row.refresh_from_db()
    assert row.pins[0][0] != host


def test_a_window_nothing_can_cover_is_delayed_told_and_the_delay_refunded(
    sim_fleet, funded, django_capture_on_commit_callbacks
) -> None:
    row, _ = reservations.book_reservation(funded, _req())
    Node.objects.filter(gpu_model__code="RTX4090").update(
        state=NodeState.FAILED, health=NodeHealth.UNREACHABLE
    )
    reservations.run_reservations(now=row.provision_at)
    row.refresh_from_db()
    assert row.state == ReservationState.DELAYED
    assert Notice.objects.filter(event="reservation_delayed").count() == 1
    reservations.run_reservations(now=row.provision_at + timedelta(minutes=1))
    assert Notice.objects.filter(event="reservation_delayed").count() == 1  # told once
    Node.objects.filter(gpu_model__code="RTX4090").update(
        state=NodeState.READY, health=NodeHealth.OK
    )
    paid = _spendable(funded)
    late = row.provision_at + timedelta(hours=6)
    with django_capture_on_commit_callbacks(execute=True):
        reservations.run_reservations(now=late)
    row.refresh_from_db()
    assert row.state == ReservationState.STARTED
    assert row.refunded == Decimal("86.40")  # 6 of 24 h of 345.60 元: the delay is not billed
    assert _spendable(funded) == paid + Decimal("86.40")


# --- the claims that are not orders honour windows too -------------------------------------------


def test_a_start_on_its_own_host_leaves_a_windows_gpus_alone(sim_fleet, funded) -> None:
    """开机 on the instance's own host (`claim_on_node`) has no known end: the GPUs a booked window
    pinned on that host are not taken, the other host's are."""
    row, _ = reservations.book_reservation(funded, _req(cards=8))
    [[pinned_host, _gpus]] = row.pins
    pinned = Node.objects.get(hostname=pinned_host)
    other = Node.objects.filter(gpu_model__code="RTX4090").exclude(pk=pinned.pk).get()
    assert claim_on_node(funded, pinned, 1) is None
    pinned.refresh_from_db()
    assert pinned.free_mask == 0xFF  # nothing taken
    assert claim_on_node(funded, other, 1) is not None


def test_a_migrations_replacement_leaves_a_windows_gpus_alone(sim_fleet, funded) -> None:
    """A failed host's replacement (`claim_replacement`) does not take a window's pins: the part
    waits (the instance stays migrating), as an order would be refused."""
    instance, _ = services.order_instance(
        funded, services.OrderRequest(gpu_model="RTX4090", cards=1)
    )
    home = instance.allocation.nodes.get().node
    row, _ = reservations.book_reservation(funded, _req(cards=8))
    assert row.pins[0][0] != home.hostname  # the window went to the other, whole host
    Node.objects.filter(pk=home.pk).update(state=NodeState.FAILED, health=NodeHealth.UNREACHABLE)
    home.refresh_from_db()
    assert claim_replacement(home, 1, whole=False) is None
    reservations.cancel_reservation(funded, row.public_id)
    replaced = claim_replacement(home, 1, whole=False)
    assert replaced is not None and replaced[0].hostname == row.pins[0][0]
