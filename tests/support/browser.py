"""Headless Chromium for the browser tests and the README screenshot (Debian's, never downloaded)."""

from __future__ import annotations

import os
import re
from typing import Any

from django.conf import settings
from django.test import Client
from playwright.sync_api import Browser, BrowserContext, Page, expect

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
# Without the background-networking flags Chromium keeps dialling out of this closed network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def select_and_settle(page: Page, selector: str, value: str) -> None:
    """Choose ``value`` in a select whose change makes htmx re-render the form around it, and wait
    until htmx has swapped the new form in *and* bound its listeners (``htmx:afterSettle``).

    htmx binds the new form's triggers one settle delay after the swap (and after the URL push),
    so a change made in that window reaches a form htmx does not listen to yet and is lost.
    """
    page.evaluate(
        """() => {
            window.__settles = 0;
            if (!window.__countsSettles) {
                document.addEventListener('htmx:afterSettle', () => { window.__settles += 1; });
                window.__countsSettles = true;
            }
        }"""
    )
    page.select_option(selector, value)
    page.wait_for_function("() => window.__settles > 0")


def server_page(browser: Browser, base_url: str, *, height: int = 900) -> Page:
    """A fresh browser profile in Chinese (the default language), 1280 pixels wide, against a
    console running as a real process: it waits up to 30 s for what that server pushes."""
    context = browser.new_context(
        base_url=base_url, locale="zh-CN", viewport={"width": 1280, "height": height}
    )
    context.set_default_timeout(30_000)
    return context.new_page()


def log_in(page: Page, username: str, password: str) -> None:
    """Through the login page, as a person would; on to the dashboard."""
    page.goto("/accounts/login/")
    page.fill("input[name=login]", username)
    page.fill("input[name=password]", password)
    page.click("#login-form button[type=submit]")
    expect(page).to_have_url(re.compile(r"/$"))


def sign_up(page: Page, email: str, password: str) -> None:
    """From the landing page's call to action to the page asking to confirm the e-mail."""
    page.goto("/")
    page.click("#cta-signup")
    page.fill("#id_email", email)
    page.fill("#id_password1", password)
    page.fill("#id_password2", password)
    page.click("#signup-form button[type=submit]")
    expect(page).to_have_url(re.compile(r"/accounts/confirm-email/$"))


def give_session(context: BrowserContext, user: Any, url: str) -> None:
    """Log ``user`` in to the live server at ``url`` without the form: the browser gets the session
    cookie of a test client logged in as them."""
    client = Client()
    client.force_login(user)
    name = settings.SESSION_COOKIE_NAME
    context.add_cookies([{"name": name, "value": client.cookies[name].value, "url": url}])
