"""The web terminal in a real browser: on a running simulated instance, "Open terminal" connects
xterm.js to the simulated shell; typing ``nvidia-smi`` shows the GPU table, Chinese output renders,
and closing the terminal records the session in the instance's events.

The console runs as a real process (uvicorn, SQLite, the embedded worker, websockets), as in
test_telemetry_chart.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support import servers
from tests.support.browser import log_in, server_page

pytestmark = pytest.mark.e2e

SETTLE_MS = 120_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Stack]:
    tmp = tmp_path_factory.mktemp("terminal")
    with servers.embedded_demo(tmp, SIM_TIME_SCALE="0", SLICES_DRIVER="sim") as server:
        yield server


@pytest.fixture
def customer(browser: Browser, stack: servers.Stack) -> Iterator[Page]:
    page = server_page(browser, stack.url, height=1000)
    log_in(page, "demo", servers.DEMO_LOGINS["demo"])
    yield page
    page.context.close()


# What the terminal holds (xterm's buffer, wide characters once): the bytes the console sent,
# whether or not xterm has painted them yet (it paints on animation frames, and not while the
# screen is out of view).
BUFFER_TEXT = """() => {
  const term = document.querySelector("#instance-terminal [data-terminal-screen]").xterm;
  if (!term) return "";
  const buffer = term.buffer.active, lines = [];
  for (let i = 0; i < buffer.length; i++) lines.push(buffer.getLine(i).translateToString(true));
  return lines.join("\\n");
}"""


def _screen_text(page: Page) -> str:
    return page.evaluate(BUFFER_TEXT)


def _expect_painted(page: Page, text: str) -> None:
    """What the page shows: xterm's rows, once the screen is in view."""
    page.locator("#instance-terminal [data-terminal-screen]").scroll_into_view_if_needed()
    expect(page.locator("#instance-terminal .xterm-rows")).to_contain_text(text)


def _wait_text(page: Page, needle: str, stack: servers.Stack) -> str:
    deadline = time.monotonic() + 90  # a loaded 2-core machine shares it with the suite
    while needle not in (text := _screen_text(page)):
        if time.monotonic() > deadline:
            status = page.locator("#instance-terminal [data-terminal-status]").inner_text()
            pytest.fail(
                f"{needle!r} not on the terminal: {text!r}; its status line: {status!r}\n"
                + stack.logs()[-6000:]
            )
        page.wait_for_timeout(100)
    return text


def test_open_the_terminal_and_run_nvidia_smi(customer: Page, stack: servers.Stack) -> None:
    page = customer
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    ordered = page.request.post(
        "/api/v1/instances/",
        data={"gpu_model": "RTX4090", "cards": 2, "name": "terminal-box"},
        headers={"X-CSRFToken": csrf, "Referer": f"{stack.url}/"},
    )
    assert ordered.status in (201, 202), ordered.text()
    public_id = ordered.json()["id"]
    deadline = time.monotonic() + SETTLE_MS / 1000
    while page.request.get(f"/api/v1/instances/{public_id}/").json()["state"] != "running":
        assert time.monotonic() < deadline, stack.logs()
        page.wait_for_timeout(200)

    page.goto(f"/instances/{public_id}/")
    card = page.locator("#instance-terminal")
    expect(card.locator("[data-terminal-simulated]")).to_be_visible()
    card.locator("[data-terminal-open]").click()
    expect(card).to_have_attribute("data-terminal-ready", "1", timeout=30_000)
    _wait_text(page, "[simulated]", stack)
    page.keyboard.type("nvidia-smi")
    page.keyboard.press("Enter")
    text = _wait_text(page, "Processes:", stack)
    assert "NVIDIA GeForce RTX 4090" in text and "CUDA Version" in text
    _expect_painted(page, "NVIDIA GeForce RTX 4090")
    page.keyboard.type("echo 你好，世界")
    page.keyboard.press("Enter")
    _wait_text(page, "\n你好，世界\n", stack)  # the command's line, then its output
    _expect_painted(page, "你好，世界")
    if os.environ.get("SCREENSHOT_DIR"):
        card.screenshot(path=os.path.join(os.environ["SCREENSHOT_DIR"], "web-terminal.png"))

    card.locator("[data-terminal-close]").click()
    expect(card.locator("[data-terminal-open]")).to_be_visible()
    # The session is recorded once the console has seen the close: who and how long.
    deadline = time.monotonic() + 30
    while True:
        events = page.request.get(f"/api/v1/instances/{public_id}/events/").json()["results"]
        codes = [e["code"] for e in events]
        if "terminal_closed" in codes:
            break
        assert time.monotonic() < deadline, codes
        page.wait_for_timeout(200)
    assert "terminal_opened" in codes
