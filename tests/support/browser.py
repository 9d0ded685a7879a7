"""Headless Chromium for the browser tests and the README screenshot (Debian's, never downloaded)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Page

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
