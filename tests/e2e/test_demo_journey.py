"""A new user's first ten minutes, in a real browser: sign up, verify the e-mail, see the 10.00 元
trial credit, open the one-click LLaMA-7B demo, accept the licence on that page, launch, watch the
training progress update live, the automatic release when the recipe finishes, and a statement
whose demo charge is below 10 元, paid from the trial credit to the cent, cash untouched.

The console runs as a real process (uvicorn, SQLite, the embedded Celery worker, websockets) on
the simulated fleet: ``SIM_TIME_SCALE=0.02`` plays the demo's ~19-minute run in about 25 seconds,
with the same structured progress lines as the real recipe, labelled simulated.
``RECIPE_TIME_LIMIT_SECONDS`` shortens the automatic release so nothing outlives the test.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.support import servers
from tests.support.browser import server_page, sign_up

pytestmark = pytest.mark.e2e

EMAIL = "ada@newlab.example.edu"
PASSWORD = "quartz-Heron-58-meadow"
SETTLE_MS = 180_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Stack]:
    tmp = tmp_path_factory.mktemp("demo-journey")
    with servers.embedded_demo(
        tmp,
        SIM_TIME_SCALE="0.02",
        SLICES_DRIVER="sim",
        STATE_DIR=str(tmp / "state"),
        RECIPE_TIME_LIMIT_SECONDS="600",
        RECIPE_FOLLOW_INTERVAL="0.5",
    ) as server:
        yield server


def _verification_link(mail_dir: Path, deadline: float) -> str:
    while time.monotonic() < deadline:
        for path in sorted(mail_dir.glob("*.log")):
            text = path.read_text(errors="replace")
            if EMAIL in text:
                found = re.search(r"https?://\S+/accounts/confirm-email/\S+/", text)
                if found:
                    return found.group(0)
        time.sleep(0.2)
    raise AssertionError(f"no verification mail in {mail_dir}")


def _yuan(text: str) -> Decimal:
    return Decimal(re.sub(r"[^0-9.\-]", "", text))


def test_a_new_user_runs_the_llama_demo_on_the_trial_credit(
    browser: Browser, stack: servers.Stack, tmp_path: Path
) -> None:
    page = server_page(browser, stack.url)

    # Sign up from the landing page, then verify from the mail (which logs in).
    sign_up(page, EMAIL, PASSWORD)
    link = _verification_link(Path(stack.env["STATE_DIR"]) / "mail", time.monotonic() + 30)
    page.goto(link)
    page.click("main form button[type=submit]")
    expect(page).to_have_url(re.compile(r"/$"))

    # The dashboard: 10.00 元 of trial credit and the demo as its call to action.
    card = page.locator("#trial-credit-card")
    expect(card.locator("#trial-credit-amount")).to_have_text("10.00 元")
    card.locator("#trial-demo-link").click()
    expect(page).to_have_url(re.compile(r"/demo/llama-7b/$"))

    # The demo page: how long, the most it can cost (below the trial credit), the licence here.
    expect(page.locator("#demo-minutes")).to_contain_text("30")
    max_cost = _yuan(page.locator("#demo-max-cost").inner_text())
    assert Decimal("0") < max_cost < Decimal("10.00"), max_cost
    expect(page.locator("#demo-license-summary")).to_contain_text("Meta")
    launch = page.locator("#demo-launch-button")
    expect(launch).to_be_enabled()
    page.screenshot(path=str(tmp_path / "demo-page.png"), full_page=True)
    page.check("#accept-license")
    launch.click()

    # The instance page, followed live: the training progress moves without a reload.
    expect(page).to_have_url(re.compile(r"/instances/[0-9a-f-]{36}/$"))
    public_id = page.url.rstrip("/").rsplit("/", 1)[1]
    page.evaluate("window.__sameDocument = 'not reloaded'")
    run = page.locator("#recipe-run")
    expect(run).to_be_visible(timeout=SETTLE_MS)
    expect(run).not_to_have_attribute("data-step", "0", timeout=SETTLE_MS)
    first_step = int(run.get_attribute("data-step") or 0)
    expect(run).not_to_have_attribute("data-step", str(first_step), timeout=SETTLE_MS)
    expect(run.locator("#recipe-curve")).to_be_visible()
    expect(run).to_contain_text("模拟")  # labelled simulated
    page.screenshot(path=str(tmp_path / "demo-training.png"))

    # It finishes, is released automatically, and says where the adapter is and what it cost.
    expect(page.locator("#instance-state")).to_have_attribute(
        "data-state", "released", timeout=SETTLE_MS
    )
    expect(run).to_have_attribute("data-done", "1")
    result = page.locator("#recipe-result")
    expect(result).to_contain_text("/pfs/adapters/llama-7b-")
    assert page.evaluate("window.__sameDocument") == "not reloaded"
    page.screenshot(path=str(tmp_path / "demo-done.png"))

    # Billing: the demo's usage charge, below 10 元, paid from the trial credit; cash untouched.
    sessions = json.loads(page.request.get("/api/v1/billing/usage-sessions/").text())["results"]
    bill = next(s for s in sessions if s["resource_id"] == public_id)
    charged = Decimal(bill["charged"])
    assert bill["state"] == "closed" and Decimal("0") < charged < Decimal("10.00"), bill
    assert charged <= max_cost
    page.goto("/billing/statement/")
    row = page.locator("#statement-usage tbody tr", has_text="llama-7b-")
    expect(row).to_have_count(1)
    assert _yuan(row.locator("td").nth(5).inner_text()) == charged
    page.goto("/billing/")
    assert _yuan(page.locator("#balance-trial").inner_text()) == Decimal("10.00") - charged
    assert _yuan(page.locator("#balance-cash").inner_text()) == Decimal("0.00")
    page.context.close()
