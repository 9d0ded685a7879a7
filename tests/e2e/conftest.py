"""Browser journeys in real headless Chromium against Django's live server (port 0).

Debian's Chromium at /usr/bin/chromium (``make system-deps``); Playwright never downloads one.
Every test in this folder is marked ``e2e``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from django.core.cache import cache
from playwright.sync_api import Browser, Page, sync_playwright

from tests.support import servers
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
    context.set_default_timeout(30_000)  # a loaded 2-core machine shares it with the suite
    page = context.new_page()
    yield page
    context.close()


# The console served by uvicorn in a thread of this process (HTTP and websockets, the same ASGI
# application as ``console.asgi`` without the embedded worker), against the test database: what
# the port proxy's journeys (JupyterLab, the AI apps) need, which Django's live server is not.
def _asgi_app() -> Any:
    from channels.auth import AuthMiddlewareStack
    from channels.routing import ProtocolTypeRouter
    from django.core.asgi import get_asgi_application

    from console.routing import OriginValidator, websocket_router
    from slices.port_views import AppHostRouter

    return AppHostRouter(
        ProtocolTypeRouter(
            {
                "http": get_asgi_application(),
                "websocket": OriginValidator(AuthMiddlewareStack(websocket_router())),
            }
        )
    )


@pytest.fixture
def console_url() -> Iterator[str]:
    port = servers.free_port()
    config = uvicorn.Config(
        _asgi_app(),
        host="127.0.0.1",
        port=port,
        lifespan="off",
        log_level="warning",
        ws="websockets-sansio",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="console-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
