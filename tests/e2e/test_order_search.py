"""The order form's asset search in a real browser (issue 29): without JavaScript its button sends
the search and the page's choices only, never the CSRF token or the order's fields; with
JavaScript the addresses htmx pushes while choosing carry no token either."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Browser

from billing.seed import seed_default_prices
from tests.slices.factories import load_small_fleet
from tests.support.browser import give_session

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_asset_search_sends_its_query_and_the_choices_only(
    browser: Browser, live_server, alice
) -> None:
    seed_default_prices()
    load_small_fleet()
    for js in (False, True):
        context = browser.new_context(
            base_url=live_server.url, locale="en-US", java_script_enabled=js
        )
        context.set_default_timeout(30_000)  # a loaded 2-core machine shares it with the suite
        give_session(context, alice, live_server.url)
        page = context.new_page()
        page.goto("/instances/new/?gpu_model=RTX4090&cards=2")
        if js:
            # Choosing pushes the form's choices into the address (htmx): never the token.
            with page.expect_response(lambda r: "/instances/new/" in r.url):
                page.select_option("#id_cards", "1")
            page.wait_for_function("() => location.search.includes('cards=1')")
            assert "csrfmiddlewaretoken" not in page.url
        page.fill("input[name=asset_q]", "llama")
        with page.expect_navigation():
            page.click("#asset-search-button")
        query = parse_qs(urlsplit(page.url).query)
        assert query["asset_q"] == ["llama"]
        assert query["gpu_model"] == ["RTX4090"]
        assert query["cards"] == (["1"] if js else ["2"])
        assert "csrfmiddlewaretoken" not in query
        assert not {"billing_mode", "name", "ssh_key", "web_ports"} & set(query)
        # The page it lands on keeps the choices and the search.
        assert page.input_value("input[name=asset_q]") == "llama"
        assert page.input_value("#id_gpu_model") == "RTX4090"
        context.close()
