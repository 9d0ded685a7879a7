"""Browser journeys in real headless Chromium against Django's live server (port 0).

Debian's Chromium at /usr/bin/chromium (``make system-deps``); Playwright never downloads one.
Every test in this folder is marked ``e2e``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.cache import cache
from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# Playwright's sync API runs an event loop in this thread; Django would refuse ORM calls from a
# thread with a running loop. The test thread only reads state to assert on it.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser, live_server) -> Iterator[Page]:  # noqa: ANN001
    """A fresh browser profile in Chinese (the default language) against the live server."""
    cache.clear()  # rate-limit counters from other tests
    context = browser.new_context(base_url=live_server.url, locale="zh-CN")
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()
