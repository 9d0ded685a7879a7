"""A new customer, end to end in a real browser: sign up from the landing page's call to action,
verify (which logs in), trial credit, SSH key, API token, and a call to the API with that token."""

from __future__ import annotations

import re

import httpx
import pytest
from django.core import mail
from playwright.sync_api import Page, expect

from tests.console.factories import ed25519_public_key
from tests.support.browser import sign_up

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

EMAIL = "grace@lab.example.edu"
PASSWORD = "orbit-Maple-73-lantern"


def test_new_customer_signs_up_verifies_and_uses_the_api(page: Page, live_server) -> None:
    # Sign up from the landing page.
    sign_up(page, EMAIL, PASSWORD)
    assert len(mail.outbox) == 1 and mail.outbox[0].to == [EMAIL]

    # Open the verification link from the mail and confirm.
    link = re.search(r"https?://\S+/accounts/confirm-email/\S+/", mail.outbox[0].body).group(0)
    assert link.startswith(live_server.url)
    page.goto(link)
    page.click("main form button[type=submit]")

    # Confirmed in the browser that signed up: logged in, the dashboard shows the trial credit
    # and the way to the demo.
    expect(page).to_have_url(re.compile(r"/$"))
    card = page.locator("#trial-credit-card")
    expect(card.locator("#trial-credit-amount")).to_have_text("10.00 元")
    expect(card.locator("a[href*='/demo/llama-7b/']")).to_be_visible()

    # Add an SSH key (htmx swaps the panel in place).
    public_key = ed25519_public_key("grace@laptop")
    page.goto("/accounts/ssh-keys/")
    page.fill("#id_name", "laptop")
    page.fill("#id_public_key", public_key)
    page.click("#ssh-key-form button[type=submit]")
    row = page.locator("#ssh-key-table tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("SHA256:")
    expect(row).to_contain_text("grace@laptop")

    # Create an API token; it is shown once.
    page.goto("/accounts/tokens/")
    page.fill("#id_name", "notebook")
    page.click("#token-form button[type=submit]")
    token = page.locator("#new-token-value").input_value()
    assert token.startswith("gct_")

    # Call the API with it, without any browser cookie.
    response = httpx.get(
        f"{live_server.url}/api/v1/ssh-keys/", headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200
    keys = response.json()["results"]
    assert [k["name"] for k in keys] == ["laptop"]
    assert keys[0]["public_key"] == " ".join(public_key.split()[:2])
    assert httpx.get(f"{live_server.url}/api/v1/ssh-keys/").status_code == 401

    # The token list now shows a last use.
    page.reload()
    row = page.locator("#token-table tbody tr")
    expect(row).to_contain_text("notebook")
    expect(row.locator("td").nth(4)).not_to_have_text("从不")
