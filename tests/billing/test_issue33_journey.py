"""Browser journey in headless Chromium (issue 33's "done when", in one account): refused a
top-up until verified, verifies personally through the sandbox, sees the decision in the notice
centre (htmx badge, mark read), tops up, requests a 普票 that an operator issues, downloads its
PDF, and exports the month's bill as XLSX."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import Client
from playwright.sync_api import Page, expect

from billing import services
from billing.invoicing import services as invoicing
from billing.invoicing.models import Invoice
from tests.console.factories import UserFactory
from tests.e2e.conftest import browser, page  # noqa: F401 - the e2e fixtures, reused

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _log_in(page: Page, live_server, user) -> None:  # noqa: F811
    client = Client()
    client.force_login(user)
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


def test_verify_top_up_invoice_and_export(
    page: Page,  # noqa: F811
    live_server,
    prices,
    settings,
    tmp_path,
) -> None:
    settings.PRIVATE_FILES_DIR = tmp_path / "private"
    user = UserFactory(verified=False, first_name="张三")
    services.grant_trial_credit(user)
    _log_in(page, live_server, user)

    # An online top-up is refused until the account is verified.
    page.goto("/billing/")
    page.fill("#id_amount", "100")
    page.locator("#topup-form button[type=submit]").click()
    expect(page.locator("#verification-required")).to_be_visible()
    page.locator("#verification-required a").click()
    expect(page).to_have_url(re.compile(r"/account/verification/$"))
    expect(page.locator("#sandbox-provider")).to_be_visible()
    page.fill("#id_real_name", "张三")
    page.fill("#id_id_number", "11010519491231002x")
    page.locator("#personal-form button[type=submit]").click()
    expect(page.locator("#verification-status")).to_have_attribute("data-state", "approved")

    # The decision is in the notice centre: the header's badge, then the inbox (htmx).
    expect(page.locator("#notice-count")).to_have_text("1")
    page.locator("#nav-notices").click()
    expect(page.locator("#inbox")).to_have_attribute("data-unread", "1")
    expect(page.locator("#notice-list")).to_contain_text("实名认证已通过")
    page.locator("#notice-list button[type=submit]").first.click()
    expect(page.locator("#inbox")).to_have_attribute("data-unread", "0")

    # Now the top-up goes through the sandbox checkout.
    page.goto("/billing/")
    page.fill("#id_amount", "100")
    page.locator("#topup-form button[type=submit]").click()
    page.locator("#sandbox-pay button[value=pay]").click()
    expect(page.locator("#balance-cash")).to_contain_text("100.00")

    # Something runs (a 1-day rental), then a 普票 is requested, issued and downloaded.
    services.purchase_term(
        user, gpu_model="RTX 4090", cards=1, days=1, resource_kind="instance", resource_id="j1"
    )
    page.goto("/billing/invoices/")
    expect(page.locator("#invoiceable")).to_contain_text("33.20")  # 43.20 less the trial's 10
    page.locator("#invoice-form button[type=submit]").click()
    expect(page.locator("#invoice-table [data-state=requested]")).to_have_count(1)
    invoicing.issue_invoice(Invoice.objects.get().public_id, by=None)
    page.reload()
    with page.expect_download() as download:
        page.locator("#invoice-table a").first.click()
    pdf = Path(download.value.path()).read_bytes()
    assert pdf.startswith(b"%PDF-") and b"/FontFile2" in pdf

    # The month's bill, as XLSX.
    page.goto("/billing/bills/")
    expect(page.locator("#ledger-check")).to_have_class(re.compile("text-success"))
    with page.expect_download() as download:
        page.locator("#export-xlsx").click()
    assert Path(download.value.path()).read_bytes()[:2] == b"PK"
