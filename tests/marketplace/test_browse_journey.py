"""The marketplace in a real browser: htmx filtering keeps the URL in sync and the back button
restores the previous results; a gated model is unlocked and handed to the order form."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from marketplace import services
from marketplace.models import Asset, LicenseAcceptance
from tests.e2e.conftest import browser, page  # noqa: F401 - the shared Chromium fixtures
from tests.support.browser import give_session

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def alice_browsing(page: Page, live_server, alice) -> None:  # noqa: F811
    """The browser logged in as alice, the whole catalogue loaded (for each test: they run
    transactional)."""
    services.load_catalogue()
    give_session(page.context, alice, live_server.url)


def test_filtering_keeps_the_url_in_sync_and_back_restores_results(
    page: Page,  # noqa: F811
    alice_browsing,
) -> None:
    page.goto("/marketplace/")
    count = page.locator("#result-count")
    everything = count.inner_text()

    page.fill("#id_q", "llama 2 7b")
    # Only the filters in use travel in the URL.
    expect(page).to_have_url(
        re.compile(r"/marketplace/\?q=llama(%20|\+)2(%20|\+)7b&sort=relevance$")
    )
    expect(page.locator("[data-hub-id='meta-llama/Llama-2-7b-hf']")).to_be_visible()
    searched = count.inner_text()
    assert searched != everything

    page.select_option("#id_gated", "no")
    expect(page).to_have_url(
        re.compile(r"/marketplace/\?q=llama(%20|\+)2(%20|\+)7b&gated=no&sort=relevance$")
    )
    expect(page.locator("[data-hub-id='meta-llama/Llama-2-7b-hf']")).to_have_count(0)

    # Back: the URL, the form and the results are those of the search without the filter.
    page.go_back()
    expect(page).not_to_have_url(re.compile(r"gated=no"))
    expect(page.locator("[data-hub-id='meta-llama/Llama-2-7b-hf']")).to_be_visible()
    expect(page.locator("#id_gated")).to_have_value("")
    expect(count).to_have_text(searched)

    # The URL is shareable: opening it directly shows the same results.
    page.goto(page.url)
    expect(count).to_have_text(searched)


def test_a_gated_model_is_accepted_once_then_sent_to_the_order_form(
    page: Page,  # noqa: F811
    alice_browsing,
    alice,
) -> None:
    llama = Asset.objects.get(hub_id="meta-llama/Llama-2-7b-hf")
    page.goto("/marketplace/models/meta-llama--llama-2-7b-hf/")
    expect(page.locator("#use-in-instance")).to_have_count(0)
    page.click("#accept-license")
    expect(page).to_have_url(re.compile(r"/marketplace/models/meta-llama--llama-2-7b-hf/$"))
    expect(page.locator("#use-in-instance")).to_have_attribute(
        "href", f"/instances/new/?assets={llama.public_id}"
    )
    assert LicenseAcceptance.objects.filter(user=alice, license__key="llama2").count() == 1

    page.goto("/images/")
    page.click("a[href='/images/megatron-lm/']")
    launch = page.locator("#megatron-core-0\\.4\\.0-ngc23\\.10 a.launch-image")
    expect(launch).to_have_attribute("href", "/instances/new/?image=megatron-core-0.4.0-ngc23.10")
