"""One customer's worst legal orders do not delay another customer's order (the embedded default).

A real console process (uvicorn, SQLite, the embedded Celery worker: 4 threads) on the simulated
fleet at ``SIM_TIME_SCALE=0.01``, with the demo recipe's parameters at the worst its bounds allow
(``RECIPE_EXTRA_ENV``: the most steps, a progress line every step, a checkpoint as often as the
bounds let it). Six accounts each launch the 8-card demo (and click again with a fresh launch key:
their live run opens instead of a second one), so six followers read 100 lines a second each,
more followers than the worker has threads. Another customer's 1-card order must reach running
within 2 s of how long it took on the idle console, measured in the same test just before.

Before the follower was one short pass per task run, each follower held a worker thread for five
minutes (sleeping between reads) and the simulated recipe rebuilt its whole timeline per read:
four such runs kept another customer's order in provisioning for minutes.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import servers

HOSTILE = [f"hostile{i}" for i in range(6)]
VICTIM = "victim"
PASSWORD = "dos-password-2026"
# The demo recipe at the worst its bounds allow (manifest.yaml bounds; 5,000 steps saving every
# step would be 5,000 checkpoints, so 25 is the least SAVE_EVERY).
WORST = {"MAX_STEPS": "5000", "LOG_EVERY": "1", "SAVE_EVERY": "25"}
ALLOWED_DELAY_S = 2.0
TIMEOUT_S = 120.0

ACCOUNTS = """
from billing.services import grant_trial_credit
from console.models import User
from console.services import mark_email_verified
for name in {names!r}:
    user = User.objects.create_user(name, f"{{name}}@example.com", {password!r})
    mark_email_verified(user)
    grant_trial_credit(user)
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Stack]:
    tmp: Path = tmp_path_factory.mktemp("embedded-dos")
    with servers.embedded_demo(
        tmp,
        SIM_TIME_SCALE="0.01",
        SLICES_DRIVER="sim",
        RECIPE_EXTRA_ENV=json.dumps(WORST),
        EMBEDDED_WORKER_THREADS="4",
    ) as running:
        code = ACCOUNTS.format(names=[*HOSTILE, VICTIM], password=PASSWORD)
        servers.manage(running.env, "shell", "-c", code)
        yield running


def _login(stack: servers.Stack, username: str) -> httpx.Client:
    client = httpx.Client(base_url=stack.url, timeout=30)
    form = client.get("/accounts/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    response = client.post(
        "/accounts/login/",
        data={"login": username, "password": PASSWORD, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{stack.url}/accounts/login/"},
    )
    assert response.status_code == 302, response.text[:500]
    return client


def _csrf(client: httpx.Client) -> dict[str, str]:
    return {"X-CSRFToken": client.cookies["csrftoken"], "Referer": f"{client.base_url}/"}


def _until(what: str, probe, stack: servers.Stack, timeout: float = TIMEOUT_S):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen in {timeout} s\n{stack.logs()}")


def _order_to_running(client: httpx.Client, stack: servers.Stack) -> float:
    """Seconds from the order to the API saying running; the instance is released after."""
    started = time.monotonic()
    response = client.post(
        "/api/v1/instances/", json={"gpu_model": "RTX4090", "cards": 1}, headers=_csrf(client)
    )
    assert response.status_code == 202, response.text
    url = f"/api/v1/instances/{response.json()['id']}/"
    _until("running", lambda: client.get(url).json()["state"] == "running", stack)
    took = time.monotonic() - started
    assert client.post(f"{url}release/", headers=_csrf(client)).status_code == 202
    _until("released", lambda: client.get(url).json()["state"] == "released", stack)
    return took


def _launch_demo(client: httpx.Client, stack: servers.Stack) -> str:
    """Launch the demo from its page; a second click with a fresh key opens the same run."""
    ids = []
    for _ in range(2):
        page = client.get("/demo/llama-7b/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        key = re.search(r'name="launch_key" value="([0-9a-f-]{36})"', page.text).group(1)
        response = client.post(
            "/demo/llama-7b/",
            data={"csrfmiddlewaretoken": csrf, "launch_key": key, "accept_license": "on"},
            headers={"Referer": f"{stack.url}/demo/llama-7b/"},
        )
        assert response.status_code == 302, response.text[-2000:]
        ids.append(response.headers["location"].rstrip("/").rsplit("/", 1)[-1])
    assert ids[0] == ids[1], ids  # one live demo run per account
    return ids[0]


def _run_lines(client: httpx.Client, public_id: str) -> int:
    rows = client.get(f"/api/v1/instances/{public_id}/logs/?limit=1000").json()["results"]
    return sum(1 for row in rows if row["step"] == "run")


def test_the_worst_legal_demo_runs_do_not_delay_another_customers_order(
    stack: servers.Stack,
) -> None:
    victim = _login(stack, VICTIM)
    baseline = [_order_to_running(victim, stack) for _ in range(3)]

    hostile = {name: _login(stack, name) for name in HOSTILE}
    runs = {name: _launch_demo(client, stack) for name, client in hostile.items()}
    for name, public_id in runs.items():
        client = hostile[name]
        _until(
            f"{name}'s demo printing its run",
            lambda c=client, p=public_id: _run_lines(c, p) > 0,
            stack,
        )

    loaded = [_order_to_running(victim, stack) for _ in range(3)]
    # The demo runs were still running (and followed) while the victim's orders ran.
    still = sum(
        hostile[name].get(f"/api/v1/instances/{pid}/").json()["state"] == "running"
        for name, pid in runs.items()
    )
    lines = {name: _run_lines(hostile[name], pid) for name, pid in runs.items()}
    print(f"\norder -> running: idle {baseline}, under load {loaded}; runs {lines}")  # noqa: T201
    assert still == len(HOSTILE), (still, lines)
    assert all(n > 100 for n in lines.values()), lines
    assert statistics.median(loaded) - statistics.median(baseline) <= ALLOWED_DELAY_S, (
        baseline,
        loaded,
    )
    assert max(loaded) - max(baseline) <= ALLOWED_DELAY_S, (baseline, loaded)
    for client in (victim, *hostile.values()):
        client.close()
