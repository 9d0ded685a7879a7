"""Rent a GPU host in a real browser: top up, order 8 × RTX 4090 from the order form, watch it come
up live (websocket, no reload), release it with one click, and find the charge, to the second, in
billing.

The console runs as a real process here (uvicorn, SQLite, the embedded Celery worker, websockets),
not Django's live server: in-process tests run tasks inline, which would provision the host inside
the order request and leave nothing to watch. ``SIM_TIME_SCALE=0.1`` makes the simulated host take
about eight seconds, long enough to see the page in its provisioning state on a loaded machine.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support import servers
from tests.support.browser import log_in, select_and_settle, server_page

pytestmark = pytest.mark.e2e

NAME = "browser-host"
# Waits for server-side progress: generous for a 2-core machine shared with the whole suite.
SETTLE_MS = 120_000
# How long the page may take to show what the server already says (one websocket message and a
# re-fetch of the live region).
PAGE_MS = 30_000
# Where the screenshots go when asked for (SCREENSHOT_DIR); otherwise the test's tmp folder.
SHOTS = os.environ.get("SCREENSHOT_DIR", "")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Stack]:
    tmp = tmp_path_factory.mktemp("instance-journey")
    with servers.embedded_demo(tmp, SIM_TIME_SCALE="0.1", SLICES_DRIVER="sim") as server:
        yield server


@pytest.fixture
def customer(browser: Browser, stack: servers.Stack) -> Iterator[Page]:
    """The demo customer, logged in, in a Chinese-speaking browser."""
    page = server_page(browser, stack.url)
    log_in(page, "demo", servers.DEMO_LOGINS["demo"])
    yield page
    page.context.close()


def _wait_for_state(page: Page, url: str, state: str, stack: servers.Stack) -> None:
    """Poll the API (as this browser's session) until the instance is in ``state``."""
    deadline = time.monotonic() + SETTLE_MS / 1000
    seen = ""
    while time.monotonic() < deadline:
        seen = json.loads(page.request.get(url).text())["state"]
        if seen == state:
            return
        page.wait_for_timeout(250)
    raise AssertionError(f"the server did not reach {state} (still {seen})\n{stack.logs()}")


def _wait_until_billed(page: Page, url: str, seconds: int) -> None:
    """Poll the instance until the server says it has run ``seconds`` (a condition, not a sleep)."""
    deadline = time.monotonic() + SETTLE_MS / 1000
    while time.monotonic() < deadline:
        body = json.loads(page.request.get(url).text())
        if body["running_at"]:
            ran = datetime.now(UTC) - _when(body["running_at"])
            if ran.total_seconds() >= seconds:
                return
        page.wait_for_timeout(250)
    raise AssertionError(f"{url} did not run {seconds} s in time")


def _when(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_customer_orders_watches_releases_and_pays_to_the_second(
    customer: Page, stack: servers.Stack, tmp_path: Path
) -> None:
    page = customer
    shots = Path(SHOTS) if SHOTS else tmp_path
    _top_up(page)
    _order_from_the_form(page)
    public_id = _provisioning_page(page, shots)
    api_url = f"/api/v1/instances/{public_id}/"
    _running_without_a_reload(page, api_url, stack, shots)

    # Let it run a couple of seconds (by its running_at; the page does not tick its cost).
    _wait_until_billed(page, api_url, seconds=2)

    _release_with_confirmation(page, api_url, stack)
    bill = _usage_row(page, public_id)
    _billed_to_the_second(page, api_url, public_id, bill)


def _top_up(page: Page) -> None:
    """Top up 100 元 through the sandbox checkout (the trial credit does not cover an hour of 8
    cards)."""
    page.goto("/billing/")
    page.fill("#id_amount", "100")
    page.click("#topup-form button[type=submit]")
    expect(page).to_have_url(re.compile(r"/billing/sandbox/checkout/"))
    page.click("#sandbox-pay button[value=pay]")
    expect(page).to_have_url(re.compile(r"/billing/$"))
    expect(page.locator("#balance-cash")).to_contain_text("100.00")


def _order_from_the_form(page: Page) -> None:
    """The order form: choose the GPU model, then 8 cards (each change re-renders the form)."""
    page.goto("/instances/new/")
    # Each change re-renders the whole form: wait for htmx to settle before the next one.
    select_and_settle(page, "#id_gpu_model", "RTX4090")
    expect(page).to_have_url(re.compile(r"[?&]gpu_model=RTX4090"))
    select_and_settle(page, "#id_cards", "8")
    expect(page).to_have_url(re.compile(r"[?&]cards=8(&|$)"))
    expect(page.locator("#order-placement h2")).to_contain_text("8 × RTX 4090")
    expect(page.locator("#id_cards")).to_have_value("8")
    page.fill("#id_name", NAME)
    expect(page.locator("#order-button")).to_be_enabled()
    page.click("#order-button")


def _provisioning_page(page: Page, shots: Path) -> str:
    """The instance page: it opens while the host is still coming up. Returns its public id."""
    expect(page).to_have_url(re.compile(r"/instances/[0-9a-f-]{36}/$"))
    public_id = page.url.rstrip("/").rsplit("/", 1)[1]
    badge = page.locator("#instance-state")
    first_state = badge.get_attribute("data-state")
    assert first_state in {"pending", "allocating", "provisioning"}, first_state
    # A marker that a reload (or any navigation) would wipe out.
    page.evaluate("window.__sameDocument = 'not reloaded'")
    expect(page.locator("#instance-progress .progress-bar").first).to_be_visible()
    page.screenshot(path=str(shots / "instance-provisioning.png"))
    return public_id


def _running_without_a_reload(page: Page, api_url: str, stack: servers.Stack, shots: Path) -> None:
    """Running, reached by the live region alone: the same document, the SSH command shown. The
    server's state is read first, so a slow machine and a page that missed the change fail
    apart."""
    badge = page.locator("#instance-state")
    _wait_for_state(page, api_url, "running", stack)
    expect(badge, "the server says running; the page did not follow").to_have_attribute(
        "data-state", "running", timeout=PAGE_MS
    )
    assert page.evaluate("window.__sameDocument") == "not reloaded"
    expect(page.locator("#instance-ssh code")).to_contain_text("ssh ")
    # What exists only while it runs appears in the same document: the GPU charts (live, a
    # point arrives) and the terminal.
    card = page.locator("#gpu-telemetry")
    expect(card.locator("[data-telemetry-status]")).to_have_attribute(
        "data-status", "live", timeout=SETTLE_MS
    )
    expect(page.locator("#instance-terminal [data-terminal-open]")).to_be_visible()
    deadline = time.monotonic() + SETTLE_MS / 1000
    while int(page.get_attribute("#gpu-telemetry", "data-points") or 0) < 1:
        assert time.monotonic() < deadline, "no chart point arrived"
        page.wait_for_timeout(200)
    assert page.evaluate("window.__sameDocument") == "not reloaded"
    expect(page.locator("#instance-progress")).to_contain_text("100 %")
    expect(page.locator("#instance-logs")).not_to_be_empty()  # log lines pushed as they came
    page.screenshot(path=str(shots / "instance-running.png"))


def _release_with_confirmation(page: Page, api_url: str, stack: servers.Stack) -> None:
    """One-click release, confirmed in the dialog."""
    badge = page.locator("#instance-state")
    dialogs: list[str] = []

    def accept(dialog) -> None:  # noqa: ANN001 - Playwright's Dialog
        dialogs.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    page.click("#release-button")
    expect(badge).to_have_attribute("data-state", re.compile("releasing|released"))
    assert dialogs and NAME in dialogs[0]
    _wait_for_state(page, api_url, "released", stack)
    expect(badge, "the server says released; the page did not follow").to_have_attribute(
        "data-state", "released", timeout=PAGE_MS
    )
    expect(page.locator("#release-button")).to_have_count(0)


def _usage_row(page: Page, public_id: str) -> dict[str, Any]:
    """Billing: the usage row of this instance, closed, with its seconds."""
    page.goto("/billing/")
    row = page.locator("#billing-usage tbody tr", has_text=NAME)
    expect(row).to_have_count(1)
    sessions = json.loads(page.request.get("/api/v1/billing/usage-sessions/").text())["results"]
    bill = next(s for s in sessions if s["resource_id"] == public_id)
    assert bill["state"] == "closed" and bill["cards"] == 8
    expect(row.locator("td").nth(5)).to_contain_text(str(bill["settled_seconds"]))
    expect(row.locator("td").nth(6)).to_contain_text(bill["charged"])
    return bill


def _billed_to_the_second(page: Page, api_url: str, public_id: str, bill: dict[str, Any]) -> None:
    """To the second: running → release request, by the server's own event times."""
    instance = json.loads(page.request.get(api_url).text())
    events = json.loads(page.request.get(f"/api/v1/instances/{public_id}/events/").text())[
        "results"
    ]
    release_at = _when(next(e["at"] for e in events if e["code"] == "release_requested"))
    ran = (release_at - _when(instance["running_at"])).total_seconds()
    assert bill["settled_seconds"] >= 2
    assert abs(bill["settled_seconds"] - ran) <= 1.5, (bill, ran)
    expected = (Decimal(bill["rate"]) * 8 * bill["settled_seconds"] / 3600).quantize(
        Decimal("0.01")
    )
    assert abs(Decimal(bill["charged"]) - expected) <= Decimal("0.01")
    assert Decimal(bill["charged"]) > 0
