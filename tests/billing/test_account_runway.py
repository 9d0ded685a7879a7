"""Affordability is per account: an order (or a start) needs the runway for everything the account
burns with it, decided by billing (``ensure_affordable``) under the account's order lock; a term
shows what it cost.

The issue's case: on the 10 元 trial, eight 4-card RTX 4090 orders (7.60 元/h each) were all
accepted, 60.80 元/h on 10 元; now the second is refused.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone, translation
from rest_framework.test import APIClient

from billing import services as billing
from billing.models import TermRental, UsageSession
from billing.seed import seed_default_prices
from console.models import User
from slices import services
from slices.choices import InstanceState
from slices.models import Instance
from slices.services import power
from tests.slices.factories import load_small_fleet, run_order
from tests.support.concurrency import race


@pytest.fixture
def fleet(settings) -> None:
    """The small fleet (16 RTX 4090 cards on two hosts) on the simulated driver, steps instant."""
    settings.SIM_TIME_SCALE = 0
    settings.SLICES_DRIVER = "sim"
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    load_small_fleet()


@pytest.fixture
def trial(alice: User, fleet) -> User:
    billing.grant_trial_credit(alice)  # 10.00 元
    return alice


def _refusal(user: User, **kw) -> billing.InsufficientFunds:
    with pytest.raises(billing.InsufficientFunds) as refused:
        services.order_instance(
            user, services.OrderRequest(**{"gpu_model": "RTX4090", "cards": 4, **kw})
        )
    return refused.value


@pytest.mark.django_db
def test_eight_4_card_orders_on_the_trial_stop_at_the_second(
    trial: User, django_capture_on_commit_callbacks
) -> None:
    first = run_order(trial, django_capture_on_commit_callbacks, cards=4)
    assert first.state == InstanceState.RUNNING  # 7.60 元/h: 10 元 runs it for 78 minutes
    refusals = [_refusal(trial) for _ in range(7)]
    assert Instance.objects.count() == 1
    refused = refusals[0]
    assert refused.params["needed"] == Decimal("15.20")  # an hour of 7.60 + 7.60 元/h
    assert refused.params["running"] == Decimal("7.60")
    assert refused.params["balance"] == Decimal("10.00")
    assert refused.params["shortfall"] == Decimal("5.20")
    with translation.override("en"):
        assert refused.message() == (
            "This order needs at least 15.20 元 to run 1 h beside what your account already "
            "runs (7.60 元/h; 15.20 元/h in all); your balance is 10.00 元. Top up 5.20 元 to "
            "order it."
        )
    with translation.override("zh-hans"):
        assert "15.20" in refused.message() and "Top up" not in refused.message()


@pytest.mark.django_db
def test_an_order_still_provisioning_counts(trial: User) -> None:
    """Billing starts when an instance runs; until then the ordering app's commitment counts."""
    services.order_instance(trial, services.OrderRequest(gpu_model="RTX4090", cards=4))
    pending = Instance.objects.get()
    assert pending.state == InstanceState.PROVISIONING  # on-commit work never ran
    assert not UsageSession.objects.exists()
    assert _refusal(trial).params["needed"] == Decimal("15.20")
    # What the order form shows says the same.
    preview = services.preview_order(trial, gpu_model="RTX4090", cards=4)
    assert "15.20" in preview.insufficient_funds


@pytest.mark.django_db
def test_the_api_answers_402_with_the_amount_to_top_up(
    trial: User, django_capture_on_commit_callbacks
) -> None:
    run_order(trial, django_capture_on_commit_callbacks, cards=4)
    api = APIClient()
    api.force_authenticate(trial)
    r = api.post("/api/v1/instances/", {"gpu_model": "RTX4090", "cards": 4}, format="json")
    assert r.status_code == 402, r.json()
    body = r.json()
    assert body["error"] == "insufficient_funds" and body["top_up_url"] == "/billing/"
    assert Decimal(body["needed"]) == Decimal("15.20")
    assert Decimal(body["shortfall"]) == Decimal("5.20")


@pytest.mark.django_db
def test_an_order_released_soon_needs_its_own_part_only_until_then(
    trial: User, django_capture_on_commit_callbacks
) -> None:
    run_order(trial, django_capture_on_commit_callbacks, cards=4)
    # 7.60 元 for the running hour + 7.60 元/h × 10 minutes = 8.87 元 ≤ 10 元
    soon = timezone.now() + timedelta(minutes=10)
    run_order(trial, django_capture_on_commit_callbacks, cards=4, auto_release_at=soon)
    assert Instance.objects.filter(state=InstanceState.RUNNING).count() == 2
    # Both now burn for the hour in the account's figure (billing does not know the release).
    assert _refusal(trial, cards=1).params["running"] == Decimal("15.20")


@pytest.mark.django_db
def test_a_start_needs_the_runway_of_everything_running(
    alice: User, fleet, django_capture_on_commit_callbacks
) -> None:
    billing.grant_voucher(alice, Decimal("15"), reason="test", valid_days=30)
    run_order(alice, django_capture_on_commit_callbacks, cards=4)  # 7.60 元/h
    stopped = run_order(alice, django_capture_on_commit_callbacks, cards=2)  # 3.80 元/h
    with django_capture_on_commit_callbacks(execute=True):
        power.stop_instance(stopped, by="alice")
    run_order(alice, django_capture_on_commit_callbacks, cards=2)  # 7.60 + 3.80 ≤ 15 元
    with pytest.raises(billing.InsufficientFunds) as refused:
        power.start_instance(stopped, by="alice")  # 15.20 元/h for an hour: more than 15 元
    assert refused.value.params["running"] == Decimal("11.40")
    stopped.refresh_from_db()
    assert stopped.state == InstanceState.STOPPED  # nothing changed
    # 无卡模式 adds no GPU charge: it starts.
    with django_capture_on_commit_callbacks(execute=True):
        power.start_instance(stopped, by="alice", mode="gpuless")
    stopped.refresh_from_db()
    assert stopped.state == InstanceState.RUNNING and stopped.gpuless


@pytest.mark.django_db
def test_a_term_is_paid_in_full_and_leaves_what_runs_covered(
    alice: User, fleet, django_capture_on_commit_callbacks
) -> None:
    billing.grant_voucher(alice, Decimal("50"), reason="test", valid_days=30)
    term = {"cards": 1, "billing_mode": "term", "term_days": 1}  # 1.80 元 × 24 h = 43.20 元
    billing.ensure_affordable(alice, "RTX 4090", 1, term_days=1)  # 43.20 ≤ 50 alone
    run_order(alice, django_capture_on_commit_callbacks, cards=4)  # 7.60 元/h runs
    refused = _refusal(alice, **term)
    assert refused.params["total"] == Decimal("43.20")
    assert refused.params["needed"] == Decimal("50.80")  # 43.20 + an hour of 7.60
    with translation.override("en"):
        assert refused.message().startswith("This 1-day term costs 43.20 元 up front, and what")


@pytest.mark.django_db
def test_a_term_released_after_seconds_shows_what_it_cost(
    alice: User, fleet, alice_client: Client, django_capture_on_commit_callbacks
) -> None:
    billing.grant_voucher(alice, Decimal("500"), reason="test", valid_days=30)
    inst = run_order(
        alice,
        django_capture_on_commit_callbacks,
        cards=1,
        billing_mode="term",
        term_days=1,
    )
    assert inst.state == InstanceState.RUNNING
    assert TermRental.objects.get().total == Decimal("43.20")
    assert inst.quoted_per_hour == Decimal("1.80")  # the locked rate, not the on-demand one
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RELEASED
    api = APIClient()
    api.force_authenticate(alice)
    body = api.get(f"/api/v1/instances/{inst.public_id}/").json()
    assert Decimal(body["cost_so_far"]) == Decimal("43.20")
    html = alice_client.get(f"/instances/{inst.public_id}/").content.decode()
    assert "43.20" in html.split('id="instance-cost"')[1][:80]


@pytest.mark.django_db
def test_account_burn_counts_each_resource_once(alice: User, fleet) -> None:
    """Billing's own tables first; a commitment it already bills or holds the payment of adds
    nothing, an unpaid term counts its price up front, a price no longer set never burns."""
    billing.grant_voucher(alice, Decimal("500"), reason="test", valid_days=30)
    billing.open_usage_session(
        alice, resource_kind="instance", resource_id="a", gpu_model="RTX 4090", cards=2
    )
    billing.purchase_term(
        alice, gpu_model="RTX 4090", cards=1, days=1, resource_kind="instance", resource_id="t"
    )
    burn = billing.account_burn(
        alice,
        [
            billing.Commitment("instance", "a", "RTX4090", 2),  # billing already
            billing.Commitment("instance", "t", "RTX4090", 1, term_days=1),  # paid
            billing.Commitment("instance", "p", "RTX4090", 4),  # provisioning
            billing.Commitment("instance", "q", "RTX4090", 1, term_days=1),  # not paid yet
            billing.Commitment("instance", "x", "V100", 8),  # no price: never billed
        ],
    )
    assert burn == billing.AccountBurn(per_hour=Decimal("11.40"), up_front=Decimal("43.20"))


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_concurrent_orders_of_one_account_share_one_balance(settings, alice: User) -> None:
    """On PostgreSQL: eight 1-card orders (1.90 元/h each) race on 10 元; an hour of five costs
    9.50 元, so five are accepted and three refused, whatever the interleaving (the funds check is
    decided under the account's order lock, counting the orders committed before)."""
    settings.SIM_TIME_SCALE = 0
    settings.SLICES_DRIVER = "sim"
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    load_small_fleet()
    seed_default_prices()  # transactional tests flush the migration-seeded price book
    billing.grant_trial_credit(alice)

    def order(i: int):
        try:
            return services.order_instance(
                alice, services.OrderRequest(gpu_model="RTX4090", cards=1)
            )[0]
        except billing.InsufficientFunds as exc:
            return exc

    results = race(8, order)
    won = [r for r in results if isinstance(r, Instance)]
    refused = [r for r in results if isinstance(r, billing.InsufficientFunds)]
    assert len(won) == 5 and len(refused) == 3, results
    assert Instance.objects.count() == 5
    burn = billing.account_burn(alice, services.instances.committed_resources(alice))
    assert burn.per_hour == Decimal("9.50") <= billing.get_wallet_summary(alice).spendable
