"""Live GPU charts in a real browser: a running simulated instance's charts gain a point a second
without a reload, and after a reload the samples from before it are drawn at once (from the ring),
not rebuilt from live samples.

The console runs as a real process (uvicorn, SQLite, the embedded worker and the embedded telemetry
relay at its real 1 Hz, websockets), as in test_instance_journey.py.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.support import servers
from tests.support.browser import log_in, server_page

pytestmark = pytest.mark.e2e

SETTLE_MS = 120_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Stack]:
    tmp = tmp_path_factory.mktemp("telemetry-chart")
    with servers.embedded_demo(tmp, SIM_TIME_SCALE="0", SLICES_DRIVER="sim") as server:
        yield server


def _logged_in(browser: Browser, stack: servers.Stack, user: str) -> Page:
    page = server_page(browser, stack.url, height=1000)
    log_in(page, user, servers.DEMO_LOGINS[user])
    return page


@pytest.fixture
def customer(browser: Browser, stack: servers.Stack) -> Iterator[Page]:
    page = _logged_in(browser, stack, "demo")
    yield page
    page.context.close()


@pytest.fixture
def operator(browser: Browser, stack: servers.Stack) -> Iterator[Page]:
    page = _logged_in(browser, stack, "ops")
    yield page
    page.context.close()


def _points(page: Page) -> int:
    return int(page.get_attribute("#gpu-telemetry", "data-points") or 0)


def _wait_points(page: Page, at_least: int) -> int:
    """Poll the chart's point count (the page's CSP forbids Playwright's string predicates)."""
    deadline = time.monotonic() + SETTLE_MS / 1000
    while (n := _points(page)) < at_least:
        assert time.monotonic() < deadline, f"the chart has {n} points, not {at_least}"
        page.wait_for_timeout(100)
    return n


def test_chart_gains_points_live_and_shows_the_past_after_a_reload(
    customer: Page, stack: servers.Stack
) -> None:
    page = customer
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    ordered = page.request.post(
        "/api/v1/instances/",
        data={"gpu_model": "RTX4090", "cards": 2, "name": "chart-box"},
        headers={"X-CSRFToken": csrf, "Referer": f"{stack.url}/"},
    )
    assert ordered.status in (201, 202), ordered.text()
    public_id = ordered.json()["id"]
    deadline = time.monotonic() + SETTLE_MS / 1000
    while page.request.get(f"/api/v1/instances/{public_id}/").json()["state"] != "running":
        assert time.monotonic() < deadline, stack.logs()
        page.wait_for_timeout(200)

    page.goto(f"/instances/{public_id}/")
    card = page.locator("#gpu-telemetry")
    expect(card.locator("[data-telemetry-status]")).to_have_attribute(
        "data-status", "live", timeout=SETTLE_MS
    )
    expect(card.locator(".uplot")).to_have_count(4)  # utilisation, memory, temperature, power
    before = _wait_points(page, 3)
    # New points arrive over the websocket: no reload, no polling.
    _wait_points(page, before + 3)
    expect(card.locator("[data-telemetry-table] tbody tr")).to_have_count(2)
    shown = _wait_points(page, 12)

    reloaded_at = time.time()
    page.reload()
    _wait_points(page, shown)
    first = float(page.get_attribute("#gpu-telemetry", "data-first-ts") or 0)
    # The oldest point drawn predates the reload by many seconds: it came from the ring, not
    # from live samples received after the page loaded.
    assert 0 < first < reloaded_at - (shown - 2)
    if os.environ.get("SCREENSHOT_DIR"):
        card.screenshot(path=os.path.join(os.environ["SCREENSHOT_DIR"], "telemetry-charts.png"))
    csv = page.request.get(card.locator("a[download]").get_attribute("href") or "")
    assert csv.status == 200 and csv.text().startswith("minute_utc,hostname,gpu")


def test_operator_heat_map_and_node_page_follow_the_fleet_live(
    customer: Page, operator: Page, stack: servers.Stack
) -> None:
    """Runs after the chart test (same console): its 2-card instance is still running."""
    running = customer.request.get("/api/v1/instances/").json()["results"]
    assert any(i["state"] == "running" for i in running)
    operator.goto("/ops/fleet/")
    cluster_links = operator.locator("a[href^='/ops/clusters/']")
    hrefs = [cluster_links.nth(i).get_attribute("href") for i in range(cluster_links.count())]
    deadline = time.monotonic() + SETTLE_MS / 1000
    sampled_cluster = None
    for href in hrefs:  # the cluster whose heat map lights up holds the instance
        operator.goto(href or "/")
        heat = operator.locator("#gpu-heatmap")
        expect(heat.locator("[data-telemetry-status]")).to_have_attribute("data-status", "live")
        until = min(deadline, time.monotonic() + 5)  # the first frame comes with the page
        while time.monotonic() < until:
            if int(heat.get_attribute("data-sampled-gpus") or 0) >= 2:
                sampled_cluster = href
                break
            operator.wait_for_timeout(200)
        if sampled_cluster:
            break
    assert sampled_cluster, "no cluster heat map showed the running instance's GPUs"
    if os.environ.get("SCREENSHOT_DIR"):
        operator.locator("#gpu-heatmap").screenshot(
            path=os.path.join(os.environ["SCREENSHOT_DIR"], "telemetry-heatmap.png")
        )
    node = operator.locator("#fabric a[data-state='allocated']").first
    node.click()
    live = operator.locator("#node-gpus-live")
    expect(live).to_be_visible(timeout=SETTLE_MS)
    expect(live.locator("tbody tr")).to_have_count(2)


def _fund_demo(stack: servers.Stack) -> None:
    """A voucher for the demo customer: a 128-card slice burns far more than the trial credit."""
    servers.manage(
        stack.env,
        "shell",
        "-c",
        "from decimal import Decimal; from billing import services as b; "
        "from console.models import User; "
        "b.grant_voucher(User.objects.get(username='demo'), Decimal('100000'), "
        "reason='test', valid_days=30)",
    )


def _hover_latest(page: Page) -> Locator:
    """Put the cursor near the right end of the first chart; its legend's time value."""
    over = page.locator("#gpu-telemetry .u-over").first
    box = over.bounding_box()
    assert box
    over.hover(position={"x": box["width"] - 4, "y": box["height"] / 2})
    return page.locator("#gpu-telemetry .u-legend").first.locator(".u-series").first


def test_a_slice_has_a_row_per_node_and_charts_in_the_pages_language(
    customer: Page, browser: Browser, stack: servers.Stack
) -> None:
    """128 × A800 (16 nodes): no per-GPU detail travels (over 64 GPUs), so the table shows a row
    per node with its 8 GPUs as coloured cells; the charts' legend (shown for a slice: mean, min,
    max) names the time axis in the page's language and prints 24-hour times, never uPlot's US
    default ("Time", "12/3/26 9:54pm")."""
    _fund_demo(stack)
    page = customer
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    ordered = page.request.post(
        "/api/v1/instances/",
        data={"gpu_model": "A800", "cards": 128, "name": "chart-slice"},
        headers={"X-CSRFToken": csrf, "Referer": f"{stack.url}/"},
    )
    assert ordered.status in (201, 202), ordered.text()
    public_id = ordered.json()["id"]
    deadline = time.monotonic() + SETTLE_MS / 1000
    while page.request.get(f"/api/v1/instances/{public_id}/").json()["state"] != "running":
        assert time.monotonic() < deadline, stack.logs()
        page.wait_for_timeout(200)

    page.goto(f"/instances/{public_id}/")
    card = page.locator("#gpu-telemetry")
    expect(card.locator("[data-telemetry-status]")).to_have_attribute(
        "data-status", "live", timeout=SETTLE_MS
    )
    rows = card.locator("[data-telemetry-nodes] tbody tr")
    expect(rows).to_have_count(16, timeout=SETTLE_MS)
    expect(card.locator("[data-telemetry-gpus-box]")).to_be_hidden()
    expect(rows.first.locator("td").first).to_have_text(re.compile(r"^#0 yc-a8-"))
    expect(rows.first.locator("td").nth(1).locator("span")).to_have_count(8)
    expect(rows.first.locator("td").nth(2)).to_have_text(re.compile(r"^\d+ / [\d.]+ / \d+ %$"))
    _wait_points(page, 3)

    legend = card.locator(".u-legend").first
    expect(legend).to_contain_text("时间")
    expect(legend).to_contain_text("平均")
    when = _hover_latest(page)
    expect(when.locator(".u-label")).to_have_text("时间")
    expect(when.locator(".u-value")).to_have_text(re.compile(r"^\d{2}:\d{2}:\d{2}$"))
    if os.environ.get("SCREENSHOT_DIR"):
        card.screenshot(path=os.path.join(os.environ["SCREENSHOT_DIR"], "telemetry-slice.png"))

    # The same page in English: English labels, the same 24-hour times.
    context = browser.new_context(
        base_url=stack.url, locale="en-US", viewport={"width": 1280, "height": 1000}
    )
    try:
        english = context.new_page()
        log_in(english, "demo", servers.DEMO_LOGINS["demo"])
        english.goto(f"/instances/{public_id}/")
        expect(english.locator("html")).to_have_attribute("lang", "en")
        _wait_points(english, 3)
        legend = english.locator("#gpu-telemetry .u-legend").first
        expect(legend).to_contain_text("mean")
        when = _hover_latest(english)
        expect(when.locator(".u-label")).to_have_text("Time")
        expect(when.locator(".u-value")).to_have_text(re.compile(r"^([01]\d|2[0-3]):\d{2}:\d{2}$"))
    finally:
        context.close()
    released = page.request.post(
        f"/api/v1/instances/{public_id}/release/",
        headers={"X-CSRFToken": csrf, "Referer": f"{stack.url}/"},
    )
    assert released.status == 202, released.text()
