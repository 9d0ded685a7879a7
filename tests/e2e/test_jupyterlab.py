"""JupyterLab through the console (issue 19), for real: an instance on an sshd test host
(runtime=process) runs the image's launch command with a real JupyterLab (var/jupyter-venv, built
by ``make jupyter-env`` from marketplace/data/jupyterlab-requirements.txt), and the console's
proxy relays it over a paramiko ``direct-tcpip`` tunnel: Chromium opens it from the Open button,
a notebook cell ``print(6*7)`` runs through the kernel's websocket and ``42`` shows on the page; a
100 MB file comes down intact (sha256) without the console holding it; an upload arrives; another
customer, a visitor and a released instance get 404.

The console is served by uvicorn in a thread of this process (HTTP and websockets, the same ASGI
application as ``console.asgi`` without the embedded worker), against the test database.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings as django_settings
from django.test import Client
from playwright.sync_api import Browser, expect

from console.models import ApiToken
from marketplace.catalogue import read_images
from slices.choices import InstanceState
from slices.drivers.ssh.commands import NODE_PATH
from slices.models import Instance, Node
from tests.marketplace.factories import ImageFactory, ImageVersionFactory
from tests.slices.factories import load_small_fleet, run_order
from tests.support.apphosts import app_host_httpx, open_app_httpx
from tests.support.browser import give_session
from tests.support.sshd import SshHostPool, configure_ssh_fleet, ssh_hosts  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
JUPYTER_VENV = ROOT / "var" / "jupyter-venv"
JUPYTER_PORT = 8888
BIG = 100 * 1024 * 1024

needs_jupyter = pytest.mark.skipif(
    not (JUPYTER_VENV / "bin" / "jupyter").exists(),
    reason="var/jupyter-venv is missing: run `make jupyter-env` (make test builds it)",
)


@pytest.fixture
def funded(alice: Any) -> Any:
    from decimal import Decimal

    from billing import services as billing
    from billing.models import PriceBook
    from billing.seed import seed_default_prices

    if not PriceBook.objects.exists():  # a transactional test before this one flushed the seed
        seed_default_prices()
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    return alice


def _launch_template() -> dict[str, Any]:
    """The shipped images' launch template (images.yaml), as the catalogue loader reads it."""
    return read_images()[0].versions[0].launch.as_dict()


@pytest.fixture
def jupyter_instance(
    settings,
    ssh_hosts: SshHostPool,  # noqa: F811
    tmp_path: Path,
    funded,
    django_capture_on_commit_callbacks,
) -> Iterator[tuple[Instance, Path]]:
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SSH_CONNECT_TIMEOUT = 5.0
    settings.SLICES_SSH_COMMAND_TIMEOUT = 60.0
    # The node's PATH has the JupyterLab the image would ship (the console layer's).
    settings.SLICES_NODE_PATH = f"{JUPYTER_VENV}/bin:{NODE_PATH}"
    load_small_fleet()
    nodes = list(Node.objects.filter(gpu_model__code="RTX4090").order_by("hostname"))
    fleet = configure_ssh_fleet(
        settings, ssh_hosts.get(1), nodes, tmp_path, client_key=ssh_hosts.client_key
    )
    version = ImageVersionFactory(
        image=ImageFactory(slug="pytorch", name="PyTorch"),
        slug="pt-jupyter",
        launch=_launch_template(),
    )
    instance = run_order(
        funded, django_capture_on_commit_callbacks, cards=1, image=version.slug, name="lab"
    )
    assert instance.state == InstanceState.RUNNING, list(
        instance.events.values_list("code", "text")
    )
    hostname = instance.nodes.get(rank=0).hostname
    workdir = fleet.workdirs[hostname] / "instances" / instance.slug
    yield instance, workdir
    with django_capture_on_commit_callbacks(execute=True):
        from slices import services

        services.release_instance(Instance.objects.get(pk=instance.pk), by="test")


def _session_cookie(user: Any) -> dict[str, str]:
    client = Client()
    client.force_login(user)
    name = django_settings.SESSION_COOKIE_NAME
    return {name: client.cookies[name].value}


def _wait_for_jupyter(http: httpx.Client) -> None:
    deadline = time.monotonic() + 90
    last = None
    while time.monotonic() < deadline:
        last = http.get("/api/status")
        if last.status_code == 200:
            return
        time.sleep(0.5)
    raise AssertionError(f"JupyterLab did not answer through the proxy: {last and last.text}")


@needs_jupyter
def test_jupyterlab_runs_a_cell_through_the_console(
    browser: Browser, console_url: str, jupyter_instance, funded, bob
) -> None:
    instance, workdir = jupyter_instance
    console = httpx.Client(cookies=_session_cookie(funded), timeout=60)
    owner = open_app_httpx(console, console_url, instance, JUPYTER_PORT)
    _wait_for_jupyter(owner)
    # The image's launch command got the console's token: without the console, no entry.
    direct = httpx.get(f"http://127.0.0.1:{JUPYTER_PORT}/api/contents")
    assert direct.status_code == 403

    # An upload (Jupyter's contents API, through the proxy) lands on the node.
    payload = os.urandom(3 * 1024 * 1024 + 7)
    put = owner.put(
        "/api/contents/upload.bin",
        json={
            "type": "file",
            "format": "base64",
            "content": base64.b64encode(payload).decode(),
        },
    )
    assert put.status_code in (200, 201), put.text
    assert (workdir / "upload.bin").read_bytes() == payload

    # A 100 MB file streams down intact.
    digest = hashlib.sha256()
    with (workdir / "big.bin").open("wb") as f:
        block = os.urandom(1024 * 1024)
        for i in range(BIG // len(block)):
            chunk = block[:-1] + bytes([i % 256])
            f.write(chunk)
            digest.update(chunk)
    got, size = hashlib.sha256(), 0
    with owner.stream("GET", "/files/big.bin") as response:
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            got.update(chunk)
            size += len(chunk)
    assert (size, got.hexdigest()) == (BIG, digest.hexdigest())

    # A notebook for the browser.
    notebook = {
        "cells": [
            {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
             "source": "print(6*7)"}
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }  # fmt: skip
    made = owner.put(
        "/api/contents/answer.ipynb",
        json={"type": "notebook", "format": "json", "content": notebook},
    )
    assert made.status_code in (200, 201), made.text

    # Nobody else gets anything: another customer (neither on the console nor on the app's
    # host), a visitor, and the console's own route of the port serves no byte of the app.
    port_route = f"{console_url}/instances/{instance.public_id}/ports/{JUPYTER_PORT}/api/status"
    with httpx.Client(cookies=_session_cookie(bob), timeout=30) as other:
        assert other.get(port_route).status_code == 404
        opened = other.get(
            f"{console_url}/instances/{instance.public_id}/web-ports/{JUPYTER_PORT}/open/"
        )
        assert opened.status_code == 404
    stranger = app_host_httpx(console_url, instance, JUPYTER_PORT)
    assert stranger.get("/api/status").status_code == 404
    assert console.get(port_route).status_code == 302  # the owner is only sent on

    context = browser.new_context(base_url=console_url, locale="zh-CN")
    context.set_default_timeout(60_000)
    give_session(context, funded, console_url)
    page = context.new_page()
    if os.environ.get("DEBUG_JUPYTER"):
        page.on("console", lambda m: print("console:", m.text))
        page.on("websocket", lambda ws: print("websocket:", ws.url))
    page.goto(f"/instances/{instance.public_id}/")
    button = page.locator("#open-jupyterlab")
    expect(button).to_be_visible()
    assert button.get_attribute("href") == (
        f"/instances/{instance.public_id}/web-ports/{JUPYTER_PORT}/open/"
    )
    page.goto(f"/instances/{instance.public_id}/web-ports/{JUPYTER_PORT}/open/")
    expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=90_000)
    # JupyterLab asks which kernel to start when a notebook opens before its kernel preference
    # is known; a user answers with the preselected one (python3), and so does the test.
    select_kernel = page.locator(".jp-Dialog").filter(has_text="Select Kernel")
    page.add_locator_handler(select_kernel, lambda dialog: dialog.locator(".jp-mod-accept").click())
    # Opened from the file browser, as a user does, in the app that has finished loading.
    page.locator(".jp-DirListing-item").filter(has_text="answer.ipynb").dblclick()
    editor = page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
    expect(editor).to_be_visible(timeout=90_000)
    # The notebook's session has its kernel, connected through the proxy's websocket and idle,
    # before the cell runs (running it earlier makes JupyterLab start a second kernel).
    expect(page.locator(".jp-NotebookPanel .jp-Toolbar-kernelName")).to_have_text(
        "Python 3 (ipykernel)", timeout=90_000
    )
    expect(page.locator(".jp-StatusBar-Widget")).to_contain_text(
        "Python 3 (ipykernel) | Idle", timeout=90_000
    )
    editor.click()
    page.keyboard.press("Shift+Enter")
    expect(page.locator(".jp-OutputArea-output").first).to_have_text("42", timeout=60_000)

    # Issue 29: whatever script the tenant's app runs, it runs on the app's own host, a site
    # apart from the console's: it reads none of the console's cookies, cannot use the owner's
    # session (its requests to the console go out without it and cannot be read), and a cookie
    # it sets for the parent domain never reaches the console.
    assert page.evaluate("location.hostname") == f"{instance.public_id}-{JUPYTER_PORT}.localhost"
    tokens_before = ApiToken.objects.filter(owner=funded).count()
    probe = page.evaluate(
        """async (console) => {
            const out = {cookies: document.cookie};
            for (const [name, init] of [
                ["token", {method: "POST", credentials: "include",
                           headers: {"Content-Type": "application/json"},
                           body: JSON.stringify({name: "stolen"})}],
                ["page", {credentials: "include"}],
            ]) {
                const url = name === "token" ? console + "/api/v1/api-tokens/" : console + "/billing/";
                try { const r = await fetch(url, init); out[name] = r.status + " " + (await r.text()).slice(0, 80); }
                catch (e) { out[name] = "refused: " + e.name; }
            }
            document.cookie = "sessionid=tenant; domain=localhost; path=/";
            document.cookie = "csrftoken=tenant; path=/";
            return out;
        }""",
        console_url,
    )
    assert "csrftoken" not in probe["cookies"] and "sessionid" not in probe["cookies"]
    assert probe["token"].startswith("refused") and probe["page"].startswith("refused"), probe
    assert ApiToken.objects.filter(owner=funded).count() == tokens_before
    console_page = context.new_page()
    console_page.goto("/billing/")
    assert console_page.url.startswith(console_url + "/billing/")  # still signed in as the owner
    assert "sessionid=tenant" not in str(context.cookies(console_url))
    context.close()

    # Released: 404 for the owner too.
    from slices import services

    services.release_instance(Instance.objects.get(pk=instance.pk), by="test")
    again = app_host_httpx(console_url, instance, JUPYTER_PORT)
    again.cookies = owner.cookies
    assert again.get("/api/status").status_code == 404
    console.close()
