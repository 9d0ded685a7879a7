"""The audit log holds 100 % of the money-moving actions (issue 30): every action of
``MONEY_ACTIONS`` is performed through its service on the simulated fleet, and each leaves exactly
one entry with its actor, team, object and before/after, written in the action's transaction."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.test import RequestFactory

from billing import services as billing
from billing.seed import seed_default_prices
from console.audit.models import AuditEntry
from console.audit.services import MONEY_ACTIONS
from console.models import Membership
from console.teams import services as teams
from console.tenancy import Acting, personal_team
from marketplace import aiapps
from marketplace import recipes as catalogue_recipes
from slices import services
from slices.services import apps, disks, power, recipes
from slices.services.instances import release_instance
from tests.console.factories import UserFactory
from tests.slices.factories import load_small_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(full_catalogue, settings) -> None:  # noqa: ANN001
    settings.SIM_TIME_SCALE = 0
    settings.SLICES_DRIVER = "sim"
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.APP_HEALTH_INTERVAL = 0.01
    settings.RECIPE_FOLLOW_INTERVAL = 0.01
    settings.BILLING_SANDBOX_PAYMENTS = True  # production mode (the integration run) has it off
    seed_default_prices()
    load_small_fleet()


class Walk:
    """Runs one action and returns the one entry it wrote (failing if it wrote none or more)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def one(self, action: str, run: Callable[[], Any]) -> AuditEntry:
        last = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0
        run()
        new = list(AuditEntry.objects.filter(id__gt=last).order_by("id"))
        assert [e.action for e in new] == [action], [e.action for e in new]
        self.seen.append(action)
        return new[0]


def test_every_money_moving_action_leaves_one_entry_with_actor_team_object_and_change(
    world, alice, operator, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    team = personal_team(alice)
    walk = Walk()
    request = RequestFactory().post("/", REMOTE_ADDR="203.0.113.7")

    def run(fn: Callable[[], Any]) -> Callable[[], Any]:
        def go() -> Any:
            with django_capture_on_commit_callbacks(execute=True):
                return fn()

        return go

    # Money in: a top-up the customer starts, the provider confirms (the system), an operator's
    # voucher and refund.
    box: dict[str, Any] = {}
    e = walk.one(
        "wallet.topup",
        lambda: box.update(
            payment=billing.start_topup(alice, "3000", provider="sandbox", request=request)[0]
        ),
    )
    payment = box["payment"]
    assert (e.actor, e.team, e.object_id) == (alice, team, str(payment.public_id))
    assert e.after["amount"] == "3000.00" and e.ip == "203.0.113.7" and not e.operator
    e = walk.one(
        "wallet.topup_confirmed",
        lambda: billing.confirm_payment(
            str(payment.public_id),
            provider="sandbox",
            provider_txn_id="audit-1",
            amount=Decimal("3000"),
        ),
    )
    assert (e.actor, e.actor_label, e.team) == (None, "system", team)
    assert e.before == {"state": "pending"} and e.after["state"] == "succeeded"
    e = walk.one(
        "wallet.voucher",
        lambda: billing.grant_voucher(
            alice, Decimal("2000"), reason="goodwill", valid_days=30, by=operator
        ),
    )
    assert (e.actor, e.team, e.operator) == (operator, team, True)
    assert e.after["amount"] == "2000.00" and e.object_label == "goodwill"
    e = walk.one(
        "wallet.refund",
        lambda: box.update(
            refund=billing.refund_cash(alice, Decimal("10"), reason="overpaid", by=operator)
        ),
    )
    assert (e.actor, e.team, e.operator) == (operator, team, True)
    assert Decimal(e.before["cash"]) - Decimal(e.after["cash"]) == Decimal("10")
    e = walk.one(
        "wallet.reversal",
        lambda: billing.reverse_transaction(box["refund"], reason="refund in error", by=operator),
    )
    assert (e.actor, e.team, e.operator, e.object_id) == (
        operator,
        team,
        True,
        str(box["refund"].public_id),
    )
    assert e.before["kind"] == "refund" and e.object_label == "refund in error"
    e = walk.one("wallet.trial", lambda: billing.grant_trial_credit(alice))
    assert (e.actor, e.team, e.after) == (alice, team, {"amount": "10.00"})

    # Compute: order, stop, start, release.
    order = services.OrderRequest(gpu_model="RTX4090", cards=4)
    e = walk.one(
        "instance.order",
        run(lambda: box.update(inst=services.order_instance(alice, order, request=request)[0])),
    )
    inst = box["inst"]
    inst.refresh_from_db()
    assert (e.actor, e.team, e.object_type, e.object_id) == (
        alice,
        team,
        "instance",
        str(inst.public_id),
    )
    assert e.after["cards"] == 4 and e.after["gpu_model"] == "RTX4090" and e.after["per_hour"]
    assert inst.state == "running"
    e = walk.one("instance.stop", run(lambda: power.stop_instance(inst, by="alice", who=alice)))
    assert (e.actor, e.before["state"], e.after["state"]) == (alice, "running", "stopping")
    inst.refresh_from_db()
    e = walk.one(
        "instance.start",
        run(lambda: power.start_instance(inst, by="alice", who=alice, request=request)),
    )
    assert (e.actor, e.before["state"], e.after["state"]) == (alice, "stopped", "provisioning")
    assert e.ip == "203.0.113.7"
    inst.refresh_from_db()
    e = walk.one("instance.release", run(lambda: release_instance(inst, by="alice", who=alice)))
    assert (e.actor, e.before["state"], e.after["state"]) == (alice, "running", "releasing")

    # Disks: create, grow, delete.
    e = walk.one(
        "disk.create",
        lambda: box.update(disk=disks.create_disk(alice, name="data", size_gb=10, region="xiamen")),
    )
    disk = box["disk"]
    assert (e.actor, e.team, e.object_id, e.after["size_gb"]) == (
        alice,
        team,
        str(disk.public_id),
        10,
    )
    e = walk.one("disk.resize", lambda: disks.resize_disk(disk, 20, who=alice))
    assert (e.before, e.after) == ({"size_gb": 10}, {"size_gb": 20})
    e = walk.one("disk.delete", lambda: disks.delete_disk(disk, who=alice))
    assert e.before["size_gb"] == 20 and e.object_label == "data"

    # An AI app and the demo: each one entry (not an order entry beside it).
    chat = aiapps.get_app("llm-chat")
    assert chat is not None
    e = walk.one(
        "app.launch",
        run(
            lambda: box.update(
                app=apps.launch_app(alice, chat, cards=1, accept_license=True, request=request)
            )
        ),
    )
    assert (e.actor, e.team, e.object_id) == (alice, team, str(box["app"].public_id))
    assert e.after["cards"] == 1
    demo = catalogue_recipes.get_demo("llama-7b")
    assert demo is not None
    # Not followed after the commit here: the simulated run ends at once and releases itself
    # (an "instance.release" by the console, another entry).
    e = walk.one(
        "demo.run",
        lambda: box.update(run=recipes.launch_recipe(alice, demo, accept_license=True)),
    )
    assert (e.actor, e.team, e.object_id) == (alice, team, str(box["run"].public_id))

    # A member's budget (console.teams.services).
    acting = Acting(team=team, user=alice, role="owner")
    membership = Membership.objects.get(team=team, user=alice)
    e = walk.one(
        "member.budget",
        lambda: teams.set_limits(acting, membership, budget_monthly="500", gpu_quota="8"),
    )
    assert e.before["budget_monthly"] is None and Decimal(e.after["budget_monthly"]) == 500
    assert e.after["gpu_quota"] == 8 and e.actor == alice

    # A booked window (issue 32): paid when booked, refunded by the cancellation rule.
    from datetime import timedelta

    from django.utils import timezone

    from slices.services import reservations

    window = reservations.BookingRequest(
        "RTX4090", 1, "xiamen", timezone.now() + timedelta(days=3), 2
    )
    e = walk.one(
        "reservation.book",
        lambda: box.update(window=reservations.book_reservation(alice, window, request=request)[0]),
    )
    assert (e.actor, e.team, e.object_id) == (alice, team, str(box["window"].public_id))
    e = walk.one(
        "reservation.cancel",
        lambda: reservations.cancel_reservation(alice, box["window"].public_id, request=request),
    )
    assert Decimal(e.after["refunded"]) == box["window"].total

    assert sorted(walk.seen) == sorted(MONEY_ACTIONS), set(MONEY_ACTIONS) - set(walk.seen)
    # Nothing of another account's team.
    assert not AuditEntry.objects.exclude(team=team).filter(action__in=MONEY_ACTIONS).exists()


def test_background_work_is_recorded_as_the_console_with_the_reason(
    world, alice, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    billing.grant_voucher(alice, Decimal("500"), reason="test", valid_days=30)
    with django_capture_on_commit_callbacks(execute=True):
        inst, _ = services.order_instance(alice, services.OrderRequest("RTX4090", cards=1))
    inst.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        assert release_instance(inst, by="auto", code="auto_release")
    entry = AuditEntry.objects.get(action="instance.release")
    assert (entry.actor, entry.actor_label, entry.team) == (None, "system", inst.team)
    assert entry.after["by"] == "auto"


def test_a_refused_action_leaves_no_entry(world, alice) -> None:  # noqa: ANN001
    """Written in the action's transaction: an order refused (no money) leaves nothing."""
    poor = UserFactory()
    with pytest.raises(billing.InsufficientFunds):
        services.order_instance(poor, services.OrderRequest("RTX4090", cards=8))
    assert not AuditEntry.objects.filter(action="instance.order").exists()


def test_an_operator_node_action_is_an_operator_entry_of_each_team_on_the_node(
    world, alice, operator, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    billing.grant_voucher(alice, Decimal("500"), reason="test", valid_days=30)
    with django_capture_on_commit_callbacks(execute=True):
        inst, _ = services.order_instance(alice, services.OrderRequest("RTX4090", cards=1))
    node = inst.nodes.get().node
    assert services.change_node_state(node, "drain", "fan", who=operator)
    [entry] = AuditEntry.objects.filter(action="ops.node")
    assert (entry.actor, entry.team, entry.operator) == (operator, inst.team, True)
    assert entry.object_id == str(inst.public_id)
    assert entry.after == {"action": "drain", "note": "fan"}
