"""Issue 30 in two browsers: an owner creates a team and invites a developer by email; the
developer accepts, acts in the team and orders on its wallet within the budget the owner set, and
is refused past it with the figures; the owner sees the order on the team's instances and in the
audit log. The owner's browser speaks Chinese, the developer's English."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.core import mail
from playwright.sync_api import Browser, expect

from billing import services as billing
from billing.seed import seed_default_prices
from console.models import Team
from slices.models import Instance
from tests.console.factories import UserFactory
from tests.slices.factories import load_small_fleet
from tests.support.browser import give_session

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_an_owner_and_a_developer_share_a_team_within_a_budget(
    browser: Browser, live_server, alice, settings
) -> None:
    settings.SIM_TIME_SCALE = 0
    settings.SLICES_DRIVER = "sim"
    seed_default_prices()
    load_small_fleet()
    bob = UserFactory(username="bob", email="bob@example.com")

    owner = browser.new_context(base_url=live_server.url, locale="zh-CN")
    owner.set_default_timeout(20_000)
    give_session(owner, alice, live_server.url)
    page = owner.new_page()
    page.goto("/teams/")
    page.fill("#team-name", "Vision Lab")
    page.click("#team-create button[type=submit]")
    expect(page.locator("h1")).to_have_text("Vision Lab")
    expect(page.locator("#acting-team")).to_have_text("Vision Lab")  # acting in it at once
    team = Team.objects.get(name="Vision Lab")
    billing.grant_voucher(team, Decimal("100"), reason="lab funds", valid_days=30)

    # The owner invites bob by email as a developer; the mail carries the link.
    page.fill("#team-invite input[name=email]", bob.email)
    page.select_option("#team-invite select[name=role]", "developer")
    page.click("#team-invite button[type=submit]")
    expect(page.locator("#invitation-list")).to_contain_text(bob.email)
    link = re.search(r"(/teams/join/[^/\s]+/)", mail.outbox[-1].body).group(1)

    dev = browser.new_context(base_url=live_server.url, locale="en-US")
    dev.set_default_timeout(20_000)
    give_session(dev, bob, live_server.url)
    bpage = dev.new_page()
    bpage.goto(link)
    bpage.click("#invitation button[type=submit]")
    expect(bpage.locator("#acting-team")).to_have_text("Vision Lab")

    # The owner gives bob a monthly budget of 3 元: one hour of one RTX 4090 (1.90 元) fits.
    page.reload()
    row = page.locator(f"#member-{bob.public_id}")
    row.locator("input[name=budget_monthly]").fill("3")
    row.locator("form").nth(1).locator("button[type=submit]").click()
    expect(page.locator(f"#member-{bob.public_id} input[name=budget_monthly]")).to_have_value(
        "3.00"
    )

    bpage.goto("/instances/new/?gpu_model=RTX4090&cards=1")
    bpage.click("#order-button")
    bpage.wait_for_url(re.compile(r"/instances/[0-9a-f-]{36}/"))
    first = Instance.objects.get()
    assert first.team == team and first.created_by == bob

    # A second one would take bob past 3 元: refused with the figures, nothing ordered.
    bpage.goto("/instances/new/?gpu_model=RTX4090&cards=1")
    bpage.click("#order-button")
    expect(bpage.locator("body")).to_contain_text("budget")
    expect(bpage.locator("body")).to_contain_text("3.00")
    assert Instance.objects.count() == 1

    # The owner sees bob's instance among the team's, and every step in the audit log.
    page.goto("/instances/")
    expect(page.locator("body")).to_contain_text(first.name)
    page.goto(f"/teams/{team.public_id}/audit/")
    for action in (
        "team.create",
        "member.invite",
        "member.join",
        "member.budget",
        "instance.order",
    ):
        expect(page.locator("body")).to_contain_text(action)
    owner.close()
    dev.close()
