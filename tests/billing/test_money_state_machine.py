"""Random sequences of orders, stops, starts, releases, settlements and top-ups on one account.

The real services on the simulated fleet, time moved by one clock that billing and slices both
read, settlement run as the beat runs it (once per window). After every step:

* the account's cash is never below minus one settlement window of its burn (plus a cent of
  rounding per session): the low-balance stop holds, whatever was ordered;
* every ledger transaction sums to zero and ``manage.py billing_reconcile`` finds nothing;
* right after an order or a start is accepted, the balance runs the account's **whole** burn for
  ``ORDER_MIN_RUNWAY_SECONDS`` (an order checked alone, as before, breaks this at once: the issue's
  eight 4-card orders on the 10 元 trial).

The kept system disks stay within the free storage quota here: billing keeps disks when money
runs out (README, *Storage and resilience*), so unpaid storage is a debt by design, not a leak of
GPU time.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from io import StringIO
from unittest import mock

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import TestCase
from django.utils import timezone
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from billing import clock
from billing import services as billing
from billing.choices import AccountKind
from billing.models import Account, UsageSession
from billing.settlement import settlement_window
from console.errors import DomainError
from console.models import User
from slices import services
from slices.choices import InstanceState
from slices.models import Instance
from slices.services import power
from tests.billing.conftest import assert_ledger_consistent
from tests.slices.factories import load_small_fleet

pytestmark = pytest.mark.django_db

CENT = Decimal("0.01")


def _capture():
    """Run what the step scheduled on commit (provisioning, teardown, billing's stop requests)."""
    return TestCase.captureOnCommitCallbacks(execute=True)


class MoneyMachine(RuleBasedStateMachine):
    """One customer on the 10 元 trial; each example runs in a savepoint rolled back at the end."""

    user: User
    frozen: clock.FrozenClock

    def __init__(self) -> None:
        super().__init__()
        self._atomic = transaction.atomic()
        self._atomic.__enter__()
        billing.grant_trial_credit(self.user)
        self.burn_seen = Decimal(0)  # the highest burn per hour since the last check

    def teardown(self) -> None:
        transaction.set_rollback(True)
        self._atomic.__exit__(None, None, None)

    @initialize(paid=st.sampled_from(["0.00", "50.00"]))
    def fund(self, paid: str) -> None:
        """The trial credit alone, or with a first top-up (enough for a 1-day term)."""
        if Decimal(paid):
            self.top_up(paid)

    # --- what the checks read ---------------------------------------------------------------
    def _burn(self) -> Decimal:
        return billing.get_wallet_summary(self.user).burn_per_hour

    def _note_burn(self) -> None:
        self.burn_seen = max(self.burn_seen, self._burn())

    def _instances(self, *states: str) -> list[Instance]:
        return list(Instance.objects.filter(created_by=self.user, state__in=states).order_by("pk"))

    def _assert_whole_runway(self) -> None:
        """Billing's rule, seen from outside: the balance runs everything for the runway."""
        committed = services.instances.committed_resources(self.user)
        burn = billing.account_burn(self.user, committed)
        runway = Decimal(billing.order_min_runway_seconds()) / 3600
        spendable = billing.get_wallet_summary(self.user).spendable
        assert spendable >= burn.per_hour * runway + burn.up_front - CENT, (spendable, burn)

    # --- steps ------------------------------------------------------------------------------
    @rule(
        model=st.sampled_from(["RTX4090", "A800"]),
        cards=st.sampled_from([1, 2, 4, 8]),
        release_after=st.sampled_from([None, 10, 90]),
    )
    def order(self, model: str, cards: int, release_after: int | None) -> None:
        """On demand, released automatically after some minutes or not."""
        release = timezone.now() + timedelta(minutes=release_after) if release_after else None
        self._order(
            services.OrderRequest(gpu_model=model, cards=cards, auto_release_at=release),
            whole_runway=release is None,
        )

    @rule(cards=st.sampled_from([1, 2]), days=st.sampled_from([1, 7]))
    def order_term(self, cards: int, days: int) -> None:
        """A locked-price term (RTX 4090), paid up front when it runs."""
        self._order(
            services.OrderRequest(
                gpu_model="RTX4090", cards=cards, billing_mode="term", term_days=days
            ),
            whole_runway=True,
        )

    def _order(self, req: services.OrderRequest, *, whole_runway: bool) -> None:
        self._note_burn()
        try:
            with _capture():
                instance, _created = services.order_instance(self.user, req)
        except (DomainError, services.NoCapacity):
            return  # refused (funds, capacity, no such term): nothing was reserved
        instance.refresh_from_db()
        if whole_runway and instance.state == InstanceState.RUNNING:
            self._assert_whole_runway()
        self._note_burn()

    @precondition(lambda self: bool(self._instances(InstanceState.RUNNING)))
    @rule(pick=st.integers(0, 15))
    def stop(self, pick: int) -> None:
        running = self._instances(InstanceState.RUNNING)
        instance = running[pick % len(running)]
        self._note_burn()
        try:
            with _capture():
                power.stop_instance(instance, by="test")
        except DomainError:
            return  # a term runs to its end
        instance.refresh_from_db()
        assert instance.state == InstanceState.STOPPED

    @precondition(lambda self: bool(self._instances(InstanceState.STOPPED)))
    @rule(pick=st.integers(0, 15), gpuless=st.booleans())
    def start(self, pick: int, gpuless: bool) -> None:
        stopped = self._instances(InstanceState.STOPPED)
        instance = stopped[pick % len(stopped)]
        self._note_burn()
        mode = power.StartMode.GPULESS if gpuless else power.StartMode.AUTO
        try:
            with _capture():
                power.start_instance(instance, by="test", mode=mode)
        except (DomainError, services.NoCapacity):
            instance.refresh_from_db()
            assert instance.state == InstanceState.STOPPED  # refused: nothing changed
            return
        instance.refresh_from_db()
        if not gpuless and instance.state == InstanceState.RUNNING:
            self._assert_whole_runway()
        self._note_burn()

    @precondition(
        lambda self: bool(
            self._instances(InstanceState.RUNNING, InstanceState.STOPPED, InstanceState.FAILED)
        )
    )
    @rule(pick=st.integers(0, 15))
    def release(self, pick: int) -> None:
        live = self._instances(InstanceState.RUNNING, InstanceState.STOPPED, InstanceState.FAILED)
        instance = live[pick % len(live)]
        self._note_burn()
        with _capture():
            services.release_instance(instance, by="test")
        instance.refresh_from_db()
        assert instance.state == InstanceState.RELEASED

    @rule(windows=st.sampled_from([1, 10, 45, 90]))
    def settle(self, windows: int) -> None:
        """Time passes; the beat settles once per window and billing's stops release."""
        for done in range(windows):
            if not UsageSession.objects.filter(
                wallet__team__personal_of=self.user, state="open"
            ).exists():
                self.frozen.advance(settlement_window() * (windows - done))  # nothing to charge
                break
            self._note_burn()
            self.frozen.advance(settlement_window())
            with _capture():
                billing.settle_usage()

    @rule(amount=st.sampled_from(["1.00", "5.00", "50.00"]))
    def top_up(self, amount: str) -> None:
        payment, _created = billing.start_topup(self.user, amount)
        billing.confirm_payment(
            str(payment.public_id),
            provider="sandbox",
            provider_txn_id=f"machine-{payment.public_id.hex}",
            amount=Decimal(amount),
        )

    # --- after every step -------------------------------------------------------------------
    @invariant()
    def cash_stays_within_one_window(self) -> None:
        self._note_burn()
        cash = Account.objects.get(
            wallet__team__personal_of=self.user, kind=AccountKind.CASH
        ).balance
        sessions = UsageSession.objects.filter(wallet__team__personal_of=self.user).count()
        window = self.burn_seen * settlement_window() / 3600
        assert cash >= -(window + CENT * sessions), (cash, self.burn_seen)
        self.burn_seen = self._burn()

    @invariant()
    def books_balance(self) -> None:
        assert_ledger_consistent()
        out, err = StringIO(), StringIO()
        call_command("billing_reconcile", stdout=out, stderr=err)  # CommandError = exit 1
        assert "no problems" in out.getvalue(), err.getvalue()


def test_no_sequence_of_orders_spends_beyond_one_window(alice: User, settings) -> None:
    settings.SIM_TIME_SCALE = 0
    settings.SLICES_DRIVER = "sim"
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SYSTEM_DISK_GB = 3  # kept system disks stay in the free 50 GB (see above)
    settings.BILLING_SANDBOX_PAYMENTS = True
    load_small_fleet()
    frozen = clock.FrozenClock(timezone.now())
    MoneyMachine.user = alice
    MoneyMachine.frozen = frozen
    # One clock for both apps: billing's and the one slices stamps runs and releases with.
    with clock.use_clock(frozen), mock.patch.object(timezone, "now", frozen.now):
        run_state_machine_as_test(
            MoneyMachine,
            settings=hsettings(
                max_examples=25,
                stateful_step_count=15,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
