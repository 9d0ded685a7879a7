"""Browser journeys in real headless Chromium against Django's live server (port 0).

Debian's Chromium at /usr/bin/chromium (``make system-deps``); Playwright never downloads one.
Every test in this folder is marked ``e2e``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.cache import cache
from playwright.sync_api import Browser, Page, sync_playwright

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    """Chromium for one test. Not session-scoped: Playwright's sync API keeps an event loop
    running in this thread while it is open, which would break later tests using asyncio.run()
    (pytest-django runs transactional tests, like these, before others)."""
    # With that loop running, Django refuses ORM calls in this thread unless told that the test
    # thread only reads state to assert on it (scoped to this test, never set for subprocesses).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser, live_server) -> Iterator[Page]:
    """A fresh browser profile in Chinese (the default language) against the live server."""
    cache.clear()  # rate-limit counters from other tests
    context = browser.new_context(base_url=live_server.url, locale="zh-CN")
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()
