"""The chat app (issue 20) for real: launched from its page like a customer does, on an sshd test
host through the ssh driver (runtime=process), its server (marketplace/apps/llm-chat/server.py)
loading a tiny instruction-tuned model made offline by the test with the recipe environment's
Transformers (var/recipe-venv, what the image ships). The instance page shows the app starting,
then Open; Chromium opens the chat page through the console's proxy, sends a message and sees a
streamed answer of the tiny model; the OpenAI-compatible API answers through the console with the
app's key (streaming included), and a wrong key gets 401.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import Client
from playwright.sync_api import Browser, expect

from billing.seed import seed_default_prices
from marketplace import aiapps
from slices.choices import InstanceState
from slices.drivers.ssh.commands import NODE_PATH
from slices.models import Instance, Node
from slices.services import apps
from tests.slices.factories import load_small_fleet
from tests.support.browser import give_session
from tests.support.sshd import SshHostPool, configure_ssh_fleet, ssh_hosts  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
RECIPE_VENV = ROOT / "var" / "recipe-venv"
TINY = ROOT / "tests" / "marketplace" / "app_tiny.py"
CHAT_PORT = 8000

needs_recipe_venv = pytest.mark.skipif(
    not (RECIPE_VENV / "bin" / "python").exists(),
    reason="var/recipe-venv is missing: run `make recipe-env` (make test builds it)",
)


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def chat_host(
    full_catalogue,
    settings,
    ssh_hosts: SshHostPool,  # noqa: F811
    tmp_path: Path,
    alice,
) -> Iterator[Any]:
    """One RTX 4090 node on a real sshd test host; the tiny chat model where the catalogue
    mounts Qwen2.5-7B-Instruct from; the recipe environment's Python first on the node's PATH."""
    assert _port_free(CHAT_PORT), f"port {CHAT_PORT} is taken on this machine: the app binds it"
    from billing import services as billing
    from billing.models import PriceBook

    if not PriceBook.objects.exists():  # a transactional test before this one flushed the seed
        seed_default_prices()
    billing.grant_trial_credit(alice)
    load_small_fleet()
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SSH_CONNECT_TIMEOUT = 5.0
    settings.SLICES_SSH_COMMAND_TIMEOUT = 60.0
    settings.APP_HEALTH_INTERVAL = 0.5
    node = Node.objects.filter(cluster__code="xm-4090").order_by("hostname").first()
    Node.objects.filter(cluster__code="xm-4090").exclude(pk=node.pk).update(free_mask=0)
    fleet = configure_ssh_fleet(
        settings, ssh_hosts.get(1), [node], tmp_path, client_key=ssh_hosts.client_key
    )
    app = aiapps.get_app("llm-chat")
    assert app is not None
    model = fleet.asset_root / "models" / app.default_model
    python = RECIPE_VENV / "bin" / "python"
    subprocess.run([str(python), str(TINY), "chat", str(model)], check=True)  # noqa: S603
    settings.SLICES_NODE_PATH = f"{python.parent}:{NODE_PATH}"
    # The image bakes the app at /opt/apps/llm-chat; a bare test host runs it from the checkout.
    settings.APP_EXTRA_ENV = {
        "APP_DIR": str(app.directory),
        "OMP_NUM_THREADS": "1",
        "HOME": str(tmp_path),
    }
    yield fleet


def _session_cookie(user: Any) -> dict[str, str]:
    from django.conf import settings as django_settings

    client = Client()
    client.force_login(user)
    name = django_settings.SESSION_COOKIE_NAME
    return {name: client.cookies[name].value}


@needs_recipe_venv
def test_the_chat_app_launched_from_its_page_answers_in_chromium_and_through_its_api(
    browser: Browser,
    console_url: str,
    chat_host,
    alice,
    django_capture_on_commit_callbacks,
) -> None:
    # Launched from the app's page (the form's defaults: 1 × RTX 4090, Qwen2.5-7B-Instruct).
    owner = Client()
    owner.force_login(alice)
    page_html = owner.get("/apps/llm-chat/").content.decode()
    assert 'id="app-launch-button"' in page_html
    with django_capture_on_commit_callbacks(execute=True):
        response = owner.post(
            "/apps/llm-chat/", {"accept_license": "on", "gpu_model": "RTX4090", "cards": "1"}
        )
    assert response.status_code == 302, response.content.decode()[:2000]
    instance = Instance.objects.get(created_by=alice, app="llm-chat")
    try:
        assert instance.state == InstanceState.RUNNING, list(
            instance.events.values_list("code", "text")
        )
        # The health check answered: the tiny model loaded on the node (the eager task waited).
        assert apps.is_ready(instance), list(instance.events.values_list("code", "text"))
        ready = instance.events.get(code="app_ready")
        print(f"\napp ready {ready.params['seconds']} s after running")

        base = f"{console_url}/apps/{instance.public_id}/v1"
        key = {"Authorization": f"Bearer {instance.app_api_key}"}
        with httpx.Client(timeout=120) as http:
            models = http.get(f"{base}/models", headers=key)
            assert models.status_code == 200, models.text
            assert models.json()["data"][0]["id"]
            wrong = http.get(f"{base}/models", headers={"Authorization": "Bearer sk-gpc-nope"})
            assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
            assert http.get(f"{base}/models").status_code == 401
            # Streaming through the console: several content chunks, then [DONE].
            body = {
                "model": models.json()["data"][0]["id"],
                "messages": [{"role": "user", "content": "你好 请 介绍 一下 你 自己"}],
                "max_tokens": 12,
                "stream": True,
            }
            pieces: list[str] = []
            done = False
            with http.stream("POST", f"{base}/chat/completions", headers=key, json=body) as sse:
                assert sse.status_code == 200
                assert sse.headers["content-type"].startswith("text/event-stream")
                for line in sse.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        break
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    pieces.append(delta.get("content") or "")
            assert done and len([p for p in pieces if p]) >= 2, pieces
            # Not streaming: one answer with its usage.
            whole = http.post(
                f"{base}/chat/completions", headers=key, json={**body, "stream": False}
            )
            assert whole.status_code == 200, whole.text
            assert whole.json()["choices"][0]["message"]["content"]
            assert whole.json()["usage"]["completion_tokens"] >= 1

        # The browser: the instance page's Open button, the chat page through the proxy.
        context = browser.new_context(base_url=console_url, locale="zh-CN")
        context.set_default_timeout(60_000)
        give_session(context, alice, console_url)
        page = context.new_page()
        page.goto(f"/instances/{instance.public_id}/")
        expect(page.locator("#app-api-key")).to_have_text(instance.app_api_key)
        button = page.locator("#app-open")
        expect(button).to_be_visible()
        page.goto(button.get_attribute("href") or "")
        expect(page.locator("#chat-input")).to_be_visible()
        page.locator("#chat-input").fill("你好 请 介绍 一下 你 自己")
        started = time.monotonic()
        page.locator("#chat-send").click()
        answer = page.locator(".msg.assistant").last
        expect(answer).to_have_attribute("data-done", "1", timeout=90_000)
        print(f"answer shown in {time.monotonic() - started:.2f} s: {answer.inner_text()!r}")
        assert answer.inner_text().strip()
        context.close()
    finally:
        with django_capture_on_commit_callbacks(execute=True):
            from slices.services.instances import release_instance

            release_instance(Instance.objects.get(pk=instance.pk), by="test")
