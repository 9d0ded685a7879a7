"""The embedded default, driven as a script would drive it.

One real console process (uvicorn, SQLite, the in-process channel layer and the embedded Celery
worker) with ``manage.py demo_setup`` run on its database and the simulated fleet at
``SIM_TIME_SCALE=0.01``. With nothing but HTTP (httpx), the script logs in as the demo customer,
creates an API token, tops up through the sandbox checkout, orders an 8-card host through the API,
sees it reach running, releases it, and finds the usage charge in the wallet's transactions and
the GPUs free again.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

import httpx
import pytest

from tests.support import servers

MODEL = "RTX4090"
# Generous: the whole host takes about a second at this scale, but the CI machine has two cores
# shared with the rest of the suite.
SETTLE_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def demo_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Stack]:
    tmp = tmp_path_factory.mktemp("embedded-instances")
    with servers.embedded_demo(tmp, SIM_TIME_SCALE="0.01", SLICES_DRIVER="sim") as stack:
        yield stack


def _csrf(client: httpx.Client) -> dict[str, str]:
    return {"X-CSRFToken": client.cookies["csrftoken"], "Referer": f"{client.base_url}/"}


def _login(client: httpx.Client) -> None:
    """The customer login page, as a browser would post it (allauth, CSRF round-trip)."""
    form = client.get("/accounts/login/")
    assert form.status_code == 200
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    response = client.post(
        "/accounts/login/",
        data={
            "login": "demo",
            "password": servers.DEMO_LOGINS["demo"],
            "csrfmiddlewaretoken": token,
        },
        headers={"Referer": f"{client.base_url}/accounts/login/"},
    )
    assert response.status_code == 302, response.text[:500]
    assert "sessionid" in client.cookies


def _wait_for(what: str, probe: Callable[[], Any], stack: servers.Stack) -> Any:
    """Poll ``probe`` until it returns something truthy (the condition, not a fixed sleep)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen in {SETTLE_TIMEOUT} s\n{stack.logs()}")


def _free(api: httpx.Client) -> int:
    rows = api.get("/api/v1/availability/").json()
    return sum(r["free_gpus"] for r in rows if r["gpu_model"] == MODEL)


def _when(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_a_script_orders_runs_and_releases_an_8_card_host_and_pays_to_the_second(
    demo_stack: servers.Stack,
) -> None:
    stack = demo_stack
    session = httpx.Client(base_url=stack.url, timeout=30)
    _login(session)
    api = _token_client(session, stack)
    order = {"gpu_model": MODEL, "cards": 8, "name": "script-host"}
    free_before = _refused_without_funds(api, order)
    spendable_before = _top_up(api, session)
    instance, url = _order_to_running(api, order, stack, free_before)

    # Bill a few seconds (read from the server's own cost, not slept for).
    _wait_for("two seconds of billing", lambda: _held(api, url), stack)

    final = _release(api, url, stack)
    charged = _billed_to_the_second(api, url, instance, final)
    _charge_in_the_transactions(api, charged, spendable_before)

    # And the GPUs are free again.
    assert _free(api) == free_before
    session.close()
    api.close()


def _token_client(session: httpx.Client, stack: servers.Stack) -> httpx.Client:
    """An API token, created through the API with the logged-in session (shown once); the client
    the script uses from then on, with only the token, no cookie."""
    created = session.post(
        "/api/v1/api-tokens/", json={"name": "order-script"}, headers=_csrf(session)
    )
    assert created.status_code == 201, created.text
    token = created.json()["token"]
    assert token.startswith("gct_")
    api = httpx.Client(base_url=stack.url, timeout=30, headers={"Authorization": f"Bearer {token}"})
    assert httpx.get(f"{stack.url}/api/v1/instances/", timeout=30).status_code == 401
    return api


def _refused_without_funds(api: httpx.Client, order: dict[str, Any]) -> int:
    """The demo's trial credit (10 元) does not cover an hour of 8 × RTX 4090: the order is
    refused with the amount to top up, and nothing is reserved. Returns the free GPUs."""
    free_before = _free(api)
    assert free_before >= 8
    refused = api.post("/api/v1/instances/", json=order)
    assert refused.status_code == 402, refused.text
    assert refused.json()["error"] == "insufficient_funds"
    assert Decimal(refused.json()["shortfall"]) > 0
    assert _free(api) == free_before
    assert api.get("/api/v1/instances/").json()["results"] == []
    return free_before


def _top_up(api: httpx.Client, session: httpx.Client) -> Decimal:
    """Top up through the sandbox: start it with the token, pay on the checkout page. Returns the
    spendable balance after it."""
    topup = api.post("/api/v1/billing/top-ups/", json={"amount": "100.00"})
    assert topup.status_code == 201, topup.text
    checkout = topup.json()["checkout_url"]
    page = session.get(checkout)
    assert page.status_code == 200
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    paid = session.post(
        checkout,
        data={"csrfmiddlewaretoken": csrf, "outcome": "pay"},
        headers={"Referer": checkout},
    )
    assert paid.status_code == 302, paid.text[:500]
    wallet = api.get("/api/v1/billing/wallet/").json()
    assert Decimal(wallet["cash"]) == Decimal("100.00")
    return Decimal(wallet["spendable"])


def _order_to_running(
    api: httpx.Client, order: dict[str, Any], stack: servers.Stack, free_before: int
) -> tuple[dict[str, Any], str]:
    """Order: 202 with the instance in a transitional state; the same key again is the same
    order; then running, with its 8 GPUs taken and a usage session open."""
    headers = {"Idempotency-Key": "script-order-1"}
    response = api.post("/api/v1/instances/", json=order, headers=headers)
    assert response.status_code == 202, response.text
    instance = response.json()
    assert instance["state"] in {"pending", "allocating", "provisioning"}
    assert instance["gpu_model"] == MODEL and instance["cards"] == 8
    url = f"/api/v1/instances/{instance['id']}/"
    again = api.post("/api/v1/instances/", json=order, headers=headers)
    assert again.status_code == 200 and again.json()["id"] == instance["id"]

    running = _wait_for(
        "running",
        lambda: (r := api.get(url).json())["state"] == "running" and r,
        stack,
    )
    assert running["ssh"]["command"].startswith("ssh ")
    assert running["progress"] == 100 and running["simulated"] is True
    assert len(running["nodes"]) == 1  # an 8-card host is one whole node
    assert _free(api) == free_before - 8
    assert api.get("/api/v1/billing/wallet/").json()["open_sessions"] == 1
    return instance, url


def _release(api: httpx.Client, url: str, stack: servers.Stack) -> dict[str, Any]:
    released = api.post(f"{url}release/")
    assert released.status_code == 202, released.text
    assert released.json()["state"] in {"releasing", "released"}
    assert api.post(f"{url}release/").status_code == 202  # idempotent
    final: dict[str, Any] = _wait_for(
        "released", lambda: (r := api.get(url).json())["state"] == "released" and r, stack
    )
    assert final["ended_at"]
    return final


def _billed_to_the_second(
    api: httpx.Client, url: str, instance: dict[str, Any], final: dict[str, Any]
) -> Decimal:
    """The usage session: opened at running, closed at the release request, billed to the
    second. Returns the charge."""
    events = api.get(f"{url}events/").json()["results"]
    codes = [e["code"] for e in events]
    assert codes.count("running") == 1 and codes.count("billing_started") == 1
    release_at = _when(next(e["at"] for e in events if e["code"] == "release_requested"))
    usage = [
        s
        for s in api.get("/api/v1/billing/usage-sessions/").json()["results"]
        if s["resource_id"] == instance["id"]
    ]
    assert len(usage) == 1, usage
    bill = usage[0]
    assert bill["state"] == "closed" and bill["close_reason"] == "released"
    assert bill["cards"] == 8 and bill["label"] == "script-host"
    assert abs((_when(bill["started_at"]) - _when(final["running_at"])).total_seconds()) < 1
    ran = (release_at - _when(final["running_at"])).total_seconds()
    assert bill["settled_seconds"] >= 2
    assert abs(bill["settled_seconds"] - ran) <= 1.5, (bill, ran)
    rate = Decimal(bill["rate"])
    expected = (rate * 8 * bill["settled_seconds"] / 3600).quantize(Decimal("0.01"))
    charged = Decimal(bill["charged"])
    assert abs(charged - expected) <= Decimal("0.01"), (charged, expected)
    assert charged > 0
    return charged


def _charge_in_the_transactions(
    api: httpx.Client, charged: Decimal, spendable_before: Decimal
) -> None:
    """The wallet's transactions hold that charge (usage postings sum to it), and nothing else
    was taken: the balance moved by exactly the charge."""
    transactions = api.get("/api/v1/billing/transactions/").json()["results"]
    usage_total = sum(Decimal(t["amount"]) for t in transactions if t["kind"] == "usage")
    assert usage_total == -charged, transactions
    wallet = api.get("/api/v1/billing/wallet/").json()
    assert Decimal(wallet["spendable"]) == spendable_before - charged
    assert wallet["open_sessions"] == 0


def _held(api: httpx.Client, url: str) -> bool:
    """True once the server says the instance has been running for at least two seconds."""
    body = api.get(url).json()
    return Decimal(body["cost_so_far"]) >= Decimal(body["quoted_per_hour"]) * 2 / 3600
