"""The production edge in a browser (issue 34): headless Chromium against Debian's nginx rendered
by ``console.edge`` in front of the console (uvicorn in a thread of this process, on the test
database), the instances on a real sshd test host (ssh driver, runtime=process). Every app host
``<id>-<port>.localhost:<edge port>`` is nginx's: it asks the console (``auth_request``) and
moves the bytes over the console's OpenSSH forward, never through Python. Chromium resolves
``*.localhost`` to loopback itself.

- JupyterLab opens from the console's Open and runs a cell (its kernel's websocket through nginx);
- the chat app (issue 20) streams its answer token by token into the page;
- a 200 MB file comes down as a browser download, whole (size and sha256).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.test import Client
from playwright.sync_api import Browser, BrowserContext, expect

from slices.choices import InstanceState
from slices.models import Instance
from tests.e2e.test_app_chat import chat_host, needs_recipe_venv  # noqa: F401
from tests.e2e.test_jupyterlab import (  # noqa: F401
    JUPYTER_PORT,
    funded,
    jupyter_instance,
    needs_jupyter,
)
from tests.support import edge as edge_support
from tests.support.browser import give_session
from tests.support.sshd import SshHostPool, configure_ssh_fleet, ssh_hosts  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
BIG = 200 * 1024 * 1024


@pytest.fixture
def edge(settings) -> Iterator[edge_support.Edge]:
    """nginx in front of the console; the console's own static files served by nginx."""
    prefix = edge_support.short_dir()
    settings.EDGE_DIR = prefix
    try:
        with (
            edge_support.console_in_thread() as web_port,
            edge_support.nginx_in_front(
                [f"127.0.0.1:{web_port}"], prefix, ROOT / "static"
            ) as running,
        ):
            yield running
    finally:
        edge_support.cleanup(prefix)


def _context(browser: Browser, edge: edge_support.Edge, user: Any) -> BrowserContext:
    context = browser.new_context(base_url=edge.url, locale="zh-CN", accept_downloads=True)
    context.set_default_timeout(60_000)
    give_session(context, user, edge.url)
    return context


def _on_the_edge(url: str, edge: edge_support.Edge, instance: Instance, port: int) -> None:
    """The page is the port's own host, on the edge's port (nginx's, not the web process's)."""
    parts = urlsplit(url)
    assert (parts.hostname, parts.port) == (f"{instance.public_id}-{port}.localhost", edge.port)


def _forwarded(edge: edge_support.Edge) -> list[Path]:
    """The OpenSSH forwards' sockets nginx read the bytes from."""
    return list((edge.prefix / "tunnels").glob("*.sock"))


@needs_jupyter
def test_jupyterlab_runs_a_cell_through_the_edge(
    browser: Browser,
    edge: edge_support.Edge,
    jupyter_instance,  # noqa: F811
    funded,  # noqa: F811
) -> None:
    instance, workdir = jupyter_instance
    notebook = (
        '{"cells": [{"cell_type": "code", "execution_count": null, "metadata": {}, '
        '"outputs": [], "source": "print(6*7)"}], "metadata": {"kernelspec": {"name": '
        '"python3", "display_name": "Python 3", "language": "python"}}, "nbformat": 4, '
        '"nbformat_minor": 5}'
    )
    (workdir / "answer.ipynb").write_text(notebook)
    context = _context(browser, edge, funded)
    page = context.new_page()
    page.goto(f"/instances/{instance.public_id}/")
    button = page.locator("#open-jupyterlab")
    expect(button).to_be_visible()
    # JupyterLab may take a while to answer after its start: the edge's 502 until then.
    href = button.get_attribute("href") or ""
    for _attempt in range(90):
        response = page.goto(href)
        if response is not None and response.status == 200:
            break
        page.wait_for_timeout(1000)
    expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=90_000)
    _on_the_edge(page.url, edge, instance, JUPYTER_PORT)
    select_kernel = page.locator(".jp-Dialog").filter(has_text="Select Kernel")
    page.add_locator_handler(select_kernel, lambda dialog: dialog.locator(".jp-mod-accept").click())
    page.locator(".jp-DirListing-item").filter(has_text="answer.ipynb").dblclick()
    editor = page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
    expect(editor).to_be_visible(timeout=90_000)
    # The kernel connected through nginx's websocket and idle before the cell runs.
    expect(page.locator(".jp-StatusBar-Widget")).to_contain_text(
        "Python 3 (ipykernel) | Idle", timeout=90_000
    )
    editor.click()
    page.keyboard.press("Shift+Enter")
    expect(page.locator(".jp-OutputArea-output").first).to_have_text("42", timeout=60_000)
    assert _forwarded(edge), "JupyterLab was not reached over the edge's OpenSSH forward"
    context.close()


@needs_recipe_venv
def test_the_chat_app_streams_its_answer_through_the_edge(
    browser: Browser,
    edge: edge_support.Edge,
    chat_host,  # noqa: F811
    alice,
    django_capture_on_commit_callbacks,
) -> None:
    owner = Client()
    owner.force_login(alice)
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
        context = _context(browser, edge, alice)
        page = context.new_page()
        page.goto(f"/instances/{instance.public_id}/")
        button = page.locator("#app-open")
        expect(button).to_be_visible()
        page.goto(button.get_attribute("href") or "")
        expect(page.locator("#chat-input")).to_be_visible()
        _on_the_edge(page.url, edge, instance, 8000)
        # Every text the answer's bubble is given as the tokens arrive.
        page.evaluate(
            """() => {
                window.__texts = [];
                new MutationObserver((records) => {
                    for (const r of records) {
                        const el = r.target.closest ? r.target : r.target.parentElement;
                        if (el && el.closest && el.closest(".msg.assistant")) {
                            window.__texts.push(el.closest(".msg.assistant").textContent);
                        }
                    }
                }).observe(document.body, {childList: true, subtree: true, characterData: true});
            }"""
        )
        page.locator("#chat-input").fill("你好 请 介绍 一下 你 自己")
        page.locator("#chat-send").click()
        answer = page.locator(".msg.assistant").last
        expect(answer).to_have_attribute("data-done", "1", timeout=90_000)
        final = answer.inner_text().strip()
        texts = [t for t in page.evaluate("window.__texts") if t.strip()]
        assert final and "error" not in (answer.get_attribute("class") or ""), final
        # Streamed: the page showed the answer growing, several texts before the whole one.
        assert len(set(texts)) >= 2, texts
        assert _forwarded(edge), "the chat was not reached over the edge's OpenSSH forward"
        context.close()
    finally:
        with django_capture_on_commit_callbacks(execute=True):
            from slices.services.instances import release_instance

            release_instance(Instance.objects.get(pk=instance.pk), by="test")


@pytest.fixture
def big_file_instance(
    settings,
    ssh_hosts: SshHostPool,  # noqa: F811
    tmp_path: Path,
    funded,  # noqa: F811
    django_capture_on_commit_callbacks,
) -> Iterator[tuple[Instance, int, str]]:
    """An instance on an sshd test host whose launch command serves a folder with a 200 MB file
    on a declared web port (``python3 -m http.server``)."""
    with edge_support.files_instance(
        settings,
        ssh_hosts,
        tmp_path,
        funded,
        django_capture_on_commit_callbacks,
        size=BIG,
        name="edge-download",
    ) as served:
        yield served


def test_a_200_mb_download_through_the_edge_arrives_whole(
    browser: Browser,
    edge: edge_support.Edge,
    big_file_instance,
    funded,  # noqa: F811
) -> None:
    instance, port, digest = big_file_instance
    context = _context(browser, edge, funded)
    page = context.new_page()
    page.goto(f"/instances/{instance.public_id}/web-ports/{port}/open/")
    _on_the_edge(page.url, edge, instance, port)
    link = page.locator("a", has_text="big.bin")
    expect(link).to_be_visible()
    with page.expect_download(timeout=300_000) as started:
        link.click()
    download = started.value
    assert download.failure() is None
    saved = Path(download.path())
    got = hashlib.sha256()
    with saved.open("rb") as f:
        while block := f.read(4 * 1024 * 1024):
            got.update(block)
    assert (saved.stat().st_size, got.hexdigest()) == (BIG, digest)
    assert _forwarded(edge), "the download did not come over the edge's OpenSSH forward"
    context.close()
