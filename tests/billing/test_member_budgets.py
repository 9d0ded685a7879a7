"""Per member: a monthly budget (元) and a card quota (issue 30).

An order or a start that would take a member past either is refused with the figures (402
``budget_exceeded``: spent, budget, this order; 409 ``quota_exceeded``: held, quota, cards); every
door (order, 开机, disks, apps, the demo) asks; concurrent orders of one member never pass either,
because both are decided under the team's lock. With "stop on exhaustion" the settlement that
spends the budget stops the member's running instances, as the low-balance stop does. Every bill
line carries its member and the members' lines sum to the team's bill to the cent.
"""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone, translation
from rest_framework.test import APIClient

from billing import budgets
from billing import services as billing
from billing.bills import files, lines
from billing.choices import CloseReason
from billing.models import UsageSession
from billing.seed import seed_default_prices
from console.models import Membership, Team, User
from console.teams import services as teams
from console.tenancy import Acting
from marketplace import aiapps
from marketplace import recipes as catalogue_recipes
from slices import services
from slices.choices import InstanceState
from slices.errors import QuotaExceeded
from slices.models import Instance
from slices.services import apps, power, recipes
from slices.services import disks as disk_service
from tests.slices.factories import load_small_fleet, run_order
from tests.support.concurrency import race

ORDER = {"gpu_model": "RTX4090"}  # 1.90 元 a card-hour on the seed price book


@pytest.fixture
def fleet(settings) -> None:
    """The small fleet (16 RTX 4090 cards on two hosts) on the simulated driver, steps instant."""
    settings.SIM_TIME_SCALE = 0
    settings.SLICES_DRIVER = "sim"
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    load_small_fleet()


@pytest.fixture
def lab(alice: User, bob: User, fleet) -> Team:
    """Alice's lab, with bob as a developer, and 1000 元 on the team's wallet."""
    team = teams.create_team(alice, "Lab")
    Membership.objects.create(team=team, user=bob, role="developer")
    billing.grant_voucher(team, Decimal("1000"), reason="lab", valid_days=30)
    return team


def owner(team: Team) -> Acting:
    return Acting(team=team, user=team.memberships.get(role="owner").user, role="owner")


def as_member(team: Team, user: User) -> Acting:
    return Acting(team=team, user=user, role="developer")


def limit(team: Team, user: User, **kw: Any) -> None:
    teams.set_limits(owner(team), Membership.objects.get(team=team, user=user), **kw)


def order(who: Any, cards: int = 1, **kw: Any) -> Instance:
    return services.order_instance(who, services.OrderRequest(cards=cards, **ORDER, **kw))[0]


# --- refusals with the figures, through the service ---------------------------------------------
@pytest.mark.django_db
def test_a_member_past_the_budget_is_refused_with_the_figures(
    lab: Team, bob: User, django_capture_on_commit_callbacks
) -> None:
    limit(lab, bob, budget_monthly="10")
    member = as_member(lab, bob)
    first = run_order(member, django_capture_on_commit_callbacks, cards=4)  # 7.60 元/h
    assert first.state == InstanceState.RUNNING
    session = UsageSession.objects.get(resource_id=str(first.public_id))
    assert session.member == bob  # attributed to the member who ordered it
    with pytest.raises(billing.BudgetExceeded) as refused:
        order(member, cards=4)
    exc = refused.value
    assert exc.http_status == 402 and exc.code == "budget_exceeded"
    assert exc.params["spent"] == Decimal("0.00")
    assert exc.params["budget"] == Decimal("10.00")
    assert exc.params["order"] == Decimal("7.60")  # its first hour, as the funds check counts
    assert exc.params["running"] == Decimal("7.60")  # the next hour of what bob runs
    with translation.override("en"):
        assert exc.message() == (
            "This order costs 7.60 元 for its first 1 h; you have spent 0.00 元 of your monthly "
            "budget of 10.00 元 in this team (what you run needs 7.60 元 more). Ask a team "
            "owner, admin or billing member to raise it."
        )
    with translation.override("zh-hans"):
        zh = exc.message()
        assert "7.60" in zh and "10.00" in zh and "Ask a team" not in zh
    # The owner has no budget: the same order passes for her; bob's 1-card order still fits.
    order(owner(lab), cards=4)
    order(member, cards=1)  # 0 + 7.60 + 1.90 ≤ 10
    # A settled hour counts as spent: then nothing more fits.
    billing.settle_usage(timezone.now() + timedelta(hours=1))
    assert billing.member_month_spend(member) >= Decimal("7.60")
    with pytest.raises(billing.BudgetExceeded) as again:
        order(member, cards=1)
    assert again.value.params["spent"] >= Decimal("7.60")


@pytest.mark.django_db
def test_a_member_past_the_card_quota_is_refused_with_the_figures(
    lab: Team, alice: User, bob: User
) -> None:
    limit(lab, bob, gpu_quota=4)
    member = as_member(lab, bob)
    order(member, cards=4)
    with pytest.raises(QuotaExceeded) as refused:
        order(member, cards=1)
    exc = refused.value
    assert exc.http_status == 409 and exc.code == "quota_exceeded"
    assert exc.params == {"quota": 4, "held": 4, "cards": 1}
    with translation.override("en"):
        assert exc.message().startswith("Your card quota in this team is 4; you hold 4, so 1 more")
    with translation.override("zh-hans"):
        assert "Your card quota" not in exc.message()
    order(owner(lab), cards=4)  # the team's other members are not bob's quota
    assert Instance.objects.filter(created_by=bob).count() == 1


@pytest.mark.django_db
def test_a_budget_change_applies_to_the_next_order(lab: Team, bob: User) -> None:
    member = as_member(lab, bob)
    order(member, cards=2)
    limit(lab, bob, budget_monthly="1")
    with pytest.raises(billing.BudgetExceeded):
        order(member, cards=1)
    limit(lab, bob, budget_monthly="")  # no budget: no limit
    order(member, cards=1)


# --- every door ---------------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_start_door_checks_the_makers_budget_and_quota(
    lab: Team, bob: User, django_capture_on_commit_callbacks
) -> None:
    member = as_member(lab, bob)
    inst = run_order(member, django_capture_on_commit_callbacks, cards=4)
    with django_capture_on_commit_callbacks(execute=True):
        power.stop_instance(inst, by="bob")
    inst.refresh_from_db()
    assert inst.state == InstanceState.STOPPED
    limit(lab, bob, budget_monthly="5")
    with pytest.raises(billing.BudgetExceeded) as refused:
        power.start_instance(inst, by="alice")  # anyone's start: bob's usage, bob's budget
    assert refused.value.params["order"] == Decimal("7.60")
    limit(lab, bob, budget_monthly="", gpu_quota=2)
    with pytest.raises(QuotaExceeded) as over:
        power.start_instance(inst, by="bob")
    assert over.value.params == {"quota": 2, "held": 0, "cards": 4}
    inst.refresh_from_db()
    assert inst.state == InstanceState.STOPPED  # nothing changed
    limit(lab, bob, gpu_quota=4, budget_monthly="10")
    with django_capture_on_commit_callbacks(execute=True):
        power.start_instance(inst, by="bob")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING


@pytest.mark.django_db
def test_the_disk_doors_check_the_budget(lab: Team, bob: User, settings) -> None:
    member = as_member(lab, bob)
    limit(lab, bob, budget_monthly="5")
    free = billing.storage_price().free_gb
    # 1000 GB beyond the free allowance at 0.01 元 a GB-day: 10.00 元 the first day.
    with pytest.raises(billing.BudgetExceeded) as refused:
        disk_service.create_disk(member, name="big", size_gb=free + 1000, region="xiamen")
    assert refused.value.params["order"] == Decimal("10.00")
    with translation.override("en"):
        assert refused.value.message().startswith("This disk's first day costs 10.00 元")
    disk = disk_service.create_disk(member, name="small", size_gb=10, region="xiamen")  # free
    assert disk.created_by == bob
    with pytest.raises(billing.BudgetExceeded):
        disk_service.resize_disk(disk, free + 1000, who=member)
    with pytest.raises(billing.BudgetExceeded):
        disk_service.resize_disk(disk, free + 1000)  # default: its maker's budget
    disk_service.resize_disk(disk, free + 100, who=member)  # 1.00 元 a day fits
    # The team's storage is shared: its session has no member.
    assert UsageSession.objects.get(resource_kind="storage").member is None


@pytest.fixture
def world(full_catalogue, settings) -> None:  # noqa: ANN001
    settings.SIM_TIME_SCALE = 0
    settings.APP_HEALTH_INTERVAL = 0.01
    settings.RECIPE_FOLLOW_INTERVAL = 0.01
    seed_default_prices()
    load_small_fleet()


def _own_budget(user: User, **kw: Any) -> None:
    """A budget on the user's own membership of their personal team (the doors that act as a
    person: the app launch and the demo)."""
    team = user.personal_team
    teams.set_limits(
        Acting(team=team, user=user, role="owner"), team.memberships.get(user=user), **kw
    )


@pytest.mark.django_db
def test_the_app_launch_door_checks_the_budget(world, alice: User) -> None:  # noqa: ANN001
    billing.grant_voucher(alice, Decimal("100"), reason="test", valid_days=30)
    _own_budget(alice, budget_monthly="1")
    chat = aiapps.get_app("llm-chat")
    assert chat is not None
    with pytest.raises(billing.BudgetExceeded) as refused:
        apps.launch_app(alice, chat, cards=1, accept_license=True)
    assert refused.value.params["budget"] == Decimal("1.00")
    assert not Instance.objects.exists()


@pytest.mark.django_db
def test_the_demo_door_checks_the_budget(world, alice: User) -> None:  # noqa: ANN001
    assert billing.grant_trial_credit(alice)
    _own_budget(alice, budget_monthly="1")
    demo = catalogue_recipes.get_demo("llama-7b")
    assert demo is not None
    with pytest.raises(billing.BudgetExceeded) as refused:
        recipes.launch_recipe(alice, demo, accept_license=True)
    # 8 × 1.90 元/h released after 30 minutes: 7.60 元, as the funds check counts it.
    assert refused.value.params["order"] == Decimal("7.60")
    assert not Instance.objects.exists()


@pytest.mark.django_db
def test_the_order_door_refuses_through_the_api_and_the_form(
    alice: User, fleet, alice_client
) -> None:
    billing.grant_voucher(alice, Decimal("100"), reason="test", valid_days=30)
    _own_budget(alice, budget_monthly="5")
    api = APIClient()
    api.force_authenticate(alice)
    r = api.post("/api/v1/instances/", {"gpu_model": "RTX4090", "cards": 4}, format="json")
    assert r.status_code == 402, r.json()
    body = r.json()
    assert body["error"] == "budget_exceeded"
    assert (body["spent"], body["budget"], body["order"]) == ("0.00", "5.00", "7.60")
    english = api.post(
        "/api/v1/instances/",
        {"gpu_model": "RTX4090", "cards": 4},
        format="json",
        HTTP_ACCEPT_LANGUAGE="en",
    )
    assert "monthly budget of 5.00 元" in english.json()["detail"]
    _own_budget(alice, budget_monthly="", gpu_quota=2)
    r = api.post("/api/v1/instances/", {"gpu_model": "RTX4090", "cards": 4}, format="json")
    assert r.status_code == 409, r.json()
    body = r.json()
    assert body["error"] == "quota_exceeded"
    assert (body["held"], body["quota"], body["cards"]) == (0, 2, 4)
    # The order form shows the same refusal, in the reader's language.
    _own_budget(alice, budget_monthly="5", gpu_quota="")
    page = alice_client.post(
        "/instances/new/",
        {"gpu_model": "RTX4090", "cards": "4", "billing_mode": "on_demand", "region": ""},
        HTTP_ACCEPT_LANGUAGE="en",
    )
    assert page.status_code == 409
    assert "monthly budget of 5.00 元" in page.content.decode()
    assert not Instance.objects.exists()


@pytest.mark.django_db
def test_a_migration_restart_is_not_refused_and_stays_the_members(
    lab: Team, bob: User, settings, tmp_path, django_capture_on_commit_callbacks
) -> None:
    """A node fails and the platform moves the instance: not an order, so no budget or quota
    refuses it (the member held these cards before); its new usage session is the member's
    again, so it counts against the budget, and "stop on exhaustion" stops it there."""
    from slices.drivers.sim import SimDriver
    from slices.services import migration

    settings.SLICES_PFS_CONSOLE_ROOT = str(tmp_path / "pfs")
    settings.SLICES_NODE_FAIL_GRACE_SECONDS = 60
    settings.SLICES_MIGRATION_VOUCHER = "0"
    inst = run_order(as_member(lab, bob), django_capture_on_commit_callbacks, cards=4)
    limit(lab, bob, budget_monthly="1", gpu_quota=1)  # past both now
    node = inst.nodes.get().node
    t0 = timezone.now()
    try:
        migration.report_node_signal(node, "xid", "Xid 79: GPU has fallen off the bus", at=t0)
        with django_capture_on_commit_callbacks(execute=True):
            assert migration.check_node_health(t0 + timedelta(seconds=61)) == [node.hostname]
    finally:
        SimDriver.revive()
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "params"))
    assert inst.nodes.get().node != node
    sessions = UsageSession.objects.filter(resource_id=str(inst.public_id)).order_by("pk")
    assert [s.member_id for s in sessions] == [bob.pk, bob.pk]
    assert [s.state for s in sessions] == ["closed", "open"]


# --- many orders at once ------------------------------------------------------------------------
def _twenty_orders(member: Acting, n: int = 20) -> list[Any]:
    out: list[Any] = []
    for _ in range(n):
        try:
            out.append(order(member, cards=1))
        except (billing.BudgetExceeded, QuotaExceeded) as exc:
            out.append(exc)
    return out


@pytest.mark.django_db
def test_twenty_orders_in_a_row_never_pass_the_budget_or_the_quota(lab: Team, bob: User) -> None:
    """The SQLite-friendly variant: one after the other, exactly what fits passes."""
    member = as_member(lab, bob)
    limit(lab, bob, budget_monthly="10")
    results = _twenty_orders(member)
    assert sum(isinstance(r, Instance) for r in results) == 5  # 5 × 1.90 = 9.50 ≤ 10
    assert all(isinstance(r, billing.BudgetExceeded) for r in results[5:])
    limit(lab, bob, budget_monthly="", gpu_quota=7)
    results = _twenty_orders(member)
    assert sum(isinstance(r, Instance) for r in results) == 2  # 5 held + 2 = the quota of 7
    assert Instance.objects.filter(created_by=bob).live().count() == 7


def _team_in_a_transactional_test(alice: User, bob: User) -> Team:
    settings_fleet()
    seed_default_prices()  # transactional tests flush the migration-seeded price book
    team = teams.create_team(alice, "Lab")
    Membership.objects.create(team=team, user=bob, role="developer")
    billing.grant_voucher(team, Decimal("1000"), reason="lab", valid_days=30)
    return team


def settings_fleet() -> None:
    load_small_fleet()


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_twenty_parallel_orders_of_one_member_never_pass_the_budget(
    settings, alice: User, bob: User
) -> None:
    """On PostgreSQL: 20 one-card orders (1.90 元/h each) of one member race on a 10 元 budget;
    five fit, whatever the interleaving."""
    settings.SIM_TIME_SCALE = 0
    settings.SLICES_DRIVER = "sim"
    team = _team_in_a_transactional_test(alice, bob)
    limit(team, bob, budget_monthly="10")
    member = as_member(team, bob)
    results = race(20, lambda i: _twenty_orders(member, 1)[0])
    won = [r for r in results if isinstance(r, Instance)]
    refused = [r for r in results if isinstance(r, billing.BudgetExceeded)]
    assert len(won) == 5 and len(refused) == 15, results
    burn = billing.member_burn(
        member, services.instances.committed_resources(member, member_id=bob.pk)
    )
    assert burn.per_hour == Decimal("9.50") <= Decimal("10")


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_twenty_parallel_orders_of_one_member_never_pass_the_quota(
    settings, alice: User, bob: User
) -> None:
    settings.SIM_TIME_SCALE = 0
    settings.SLICES_DRIVER = "sim"
    team = _team_in_a_transactional_test(alice, bob)
    limit(team, bob, gpu_quota=3)
    member = as_member(team, bob)
    results = race(20, lambda i: _twenty_orders(member, 1)[0])
    won = [r for r in results if isinstance(r, Instance)]
    refused = [r for r in results if isinstance(r, QuotaExceeded)]
    assert len(won) == 3 and len(refused) == 17, results
    assert Instance.objects.filter(created_by=bob).live().count() == 3


# --- stop on exhaustion -------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_settlement_that_spends_the_budget_stops_the_members_instances(
    lab: Team, alice: User, bob: User, django_capture_on_commit_callbacks
) -> None:
    limit(lab, bob, budget_monthly="10", stop_on_budget=True)
    mine = run_order(as_member(lab, bob), django_capture_on_commit_callbacks, cards=4)
    hers = run_order(owner(lab), django_capture_on_commit_callbacks, cards=4)
    start = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        first = billing.settle_usage(start + timedelta(hours=1))  # 7.60 of 10 元 spent
    assert first.stopped == []
    with django_capture_on_commit_callbacks(execute=True):
        second = billing.settle_usage(start + timedelta(minutes=80))  # 10.13 元: spent
    assert len(second.stopped) == 1
    session = UsageSession.objects.get(resource_id=str(mine.public_id))
    assert session.state == "closed" and session.close_reason == CloseReason.BUDGET_EXHAUSTED
    mine.refresh_from_db()
    hers.refresh_from_db()
    # Released as the low-balance stop releases; alice's instance runs on.
    assert mine.state in (InstanceState.RELEASING, InstanceState.RELEASED)
    assert hers.state == InstanceState.RUNNING
    assert budgets.month_spend(lab.pk, bob.pk, start + timedelta(minutes=80)) >= Decimal("10")
    from console.notices.models import Notice

    told = Notice.objects.get(recipient=bob, event="budget_stopped")
    assert told.params["budget"] == "10.00" and told.params["n"] == "1"
    assert told.params["team"] == "Lab"
    assert not Notice.objects.filter(recipient=alice, event="budget_stopped").exists()
    stopped = mine.events.get(code="billing_stopped")
    assert stopped.params == {"reason": "budget_exhausted"}
    from slices.messages import event_text

    with translation.override("en"):
        assert event_text(stopped.code, stopped.params) == (
            "Stopped by billing: its maker's monthly budget in the team is spent"
        )


@pytest.mark.django_db
def test_without_stop_on_exhaustion_nothing_is_stopped(
    lab: Team, bob: User, stop_requests, django_capture_on_commit_callbacks
) -> None:
    run_order(as_member(lab, bob), django_capture_on_commit_callbacks, cards=4)
    limit(lab, bob, budget_monthly="1")
    billing.settle_usage(timezone.now() + timedelta(hours=2))
    assert stop_requests == []


# --- statements per member ----------------------------------------------------------------------
@pytest.mark.django_db
def test_the_members_lines_sum_to_the_teams_bill(
    lab: Team, alice: User, bob: User, django_capture_on_commit_callbacks
) -> None:
    run_order(as_member(lab, bob), django_capture_on_commit_callbacks, cards=2)
    run_order(owner(lab), django_capture_on_commit_callbacks, cards=1)
    free = billing.storage_price().free_gb
    disk_service.create_disk(as_member(lab, bob), name="d", size_gb=free + 77, region="xiamen")
    billing.purchase_term(
        as_member(lab, bob),
        gpu_model="RTX 4090",
        cards=1,
        days=1,
        resource_kind="instance",
        resource_id="t-1",
    )
    start = timezone.now()
    for minutes in (7, 19, 41, 60):
        billing.settle_usage(start + timedelta(minutes=minutes))
    # A correction of a settlement both members are in: split between them.
    usage = lab.wallet.transactions.filter(kind="usage").order_by("id")[1]
    billing.reverse_transaction(usage, reason="fault compensation")
    period, rows = lines.month_lines(lab)
    assert rows and all(line.member in ("alice", "bob", "") for line in rows)
    team_total = lines.ledger_month_total(lab, period)
    by_member = lines.summary(rows, "member")
    assert {r.key for r in by_member} == {"alice", "bob", "—"}  # "—": the shared storage
    assert sum((r.totals.amount for r in by_member), Decimal(0)) == team_total > 0
    for r in by_member:
        t = r.totals
        assert t.voucher + t.trial + t.cash == t.amount
    corrections = [line for line in rows if line.mode == "correction"]
    assert {line.member for line in corrections} >= {"alice", "bob"}
    for line in rows:
        assert line.voucher + line.trial + line.cash == line.amount
    # What the budget counts is the member's lines, to the cent.
    for member, user in (("alice", alice), ("bob", bob)):
        lines_total = sum((line.amount for line in rows if line.member == member), Decimal(0))
        assert billing.member_month_spend(lab, user.pk) == lines_total
    # The CSV keeps its columns and fills the member column.
    table = list(csv.reader(io.StringIO(files.to_csv(rows).decode("utf-8-sig"))))
    assert len(table[0]) == 17 and table[0][16] == files.headers()[16]
    assert {row[16] for row in table[1:]} == {"alice", "bob", ""}


@pytest.mark.django_db
def test_the_data_migration_gives_old_rows_their_teams_person(alice: User, prices) -> None:
    """Rows written before teams (no member) get their personal team's person."""
    import importlib

    from django.apps import apps as registry

    from billing.models import TermRental

    session = billing.open_usage_session(
        alice, resource_kind="instance", resource_id="old", gpu_model="RTX 4090", cards=1
    )
    billing.grant_voucher(alice, Decimal("100"), reason="test", valid_days=30)
    rental = billing.purchase_term(
        alice, gpu_model="RTX 4090", cards=1, days=1, resource_kind="instance", resource_id="t"
    )
    UsageSession.objects.filter(pk=session.pk).update(member=None)
    TermRental.objects.filter(pk=rental.pk).update(member=None)
    module = importlib.import_module("billing.migrations.0011_member_attribution")
    module.fill_members(registry, None)
    assert UsageSession.objects.get(pk=session.pk).member == alice
    assert TermRental.objects.get(pk=rental.pk).member == alice


@pytest.mark.django_db
def test_the_usage_csv_and_api_add_the_member(alice: User, alice_client, prices) -> None:
    billing.open_usage_session(
        alice, resource_kind="instance", resource_id="i-1", gpu_model="RTX 4090", cards=1
    )
    table = list(
        csv.reader(io.StringIO(alice_client.get("/billing/usage.csv").content.decode("utf-8-sig")))
    )
    assert table[0][:13] == [  # the columns as they were, the member added at the end
        "session",
        "resource_kind",
        "resource",
        "name",
        "gpu_model",
        "cards",
        "rate",
        "started",
        "ended",
        "seconds",
        "amount",
        "state",
        "price_version",
    ]
    assert table[0][13] == "member" and table[1][13] == "alice"
    api = APIClient()
    api.force_authenticate(alice)
    body = api.get("/api/v1/billing/usage-sessions/").json()
    assert body["results"][0]["member"] == str(alice.public_id)
