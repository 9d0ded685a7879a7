"""Live GPU charts in a real browser: a running simulated instance's charts gain a point a second
without a reload, and after a reload the samples from before it are drawn at once (from the ring),
not rebuilt from live samples.

The console runs as a real process (uvicorn, SQLite, the embedded worker and the embedded telemetry
relay at its real 1 Hz, websockets), as in test_instance_journey.py.
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
