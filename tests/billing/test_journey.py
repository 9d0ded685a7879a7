"""Browser journey in headless Chromium: top up through the sandbox checkout, see the balance."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client
from playwright.sync_api import Page, expect

from billing import services
from tests.e2e.conftest import browser, page  # noqa: F401 - the e2e fixtures, reused

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_top_up_in_the_browser(page: Page, live_server, alice, prices) -> None:  # noqa: F811
    services.grant_trial_credit(alice)
    client = Client()
    client.force_login(alice)
    host = live_server.url.split("//", 1)[1].split(":")[0]
    page.context.add_cookies(
        [
            {
                "name": "sessionid",
                "value": client.cookies["sessionid"].value,
                "domain": host,
                "path": "/",
            }
        ]
    )
    page.goto("/billing/")
    expect(page.locator("#balance-trial")).to_contain_text("10.00 元")
    page.fill("#id_amount", "100000")
    page.locator("#topup-form button[type=submit]").click()
    expect(page.locator("#sandbox-pay")).to_be_visible()
    page.locator("#sandbox-pay button[value=pay]").click()
    expect(page.locator("#balance-cash")).to_contain_text("100,000.00 元")
    expect(page.locator("#balance-vouchers")).to_contain_text("5,000.00 元")
    # one ledger transaction: the cash and the 5 % voucher together
    expect(page.locator("#billing-transactions")).to_contain_text("105,000.00 元")
    summary = services.get_wallet_summary(alice)
    assert summary.cash == Decimal("100000.00") and summary.vouchers == Decimal("5000.00")
