"""The 大模型对话 (LLM chat) app's server really serves a model: marketplace/apps/llm-chat/server.py.

The server runs as the instance runs it: a subprocess of the recipe environment's Python (torch
CPU and transformers live there, not in the console's environment), on a free loopback port, with
a tiny LLaMA chat model made offline by ``app_tiny.py`` (word-level tokenizer, a chat template,
random weights). The test talks to it over HTTP with httpx, as the console's port proxy and an
OpenAI client would.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "marketplace" / "apps" / "llm-chat" / "server.py"
TINY = Path(__file__).with_name("app_tiny.py")
PYTHON = Path(os.environ.get("RECIPE_VENV", ROOT / "var" / "recipe-venv")) / "bin" / "python"
API_KEY = "sk-test-app-key"
JUPYTER_TOKEN = "jupyter-test-token"
MODEL_NAME = "tiny-chat"

pytestmark = pytest.mark.skipif(
    not PYTHON.exists(),
    reason=f"the recipe environment ({PYTHON}) is missing: run `make recipe-env`",
)

QUESTION = [{"role": "user", "content": "你好 请 介绍 一下 你 自己"}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    url: str
    process: subprocess.Popen[str]
    first_health: httpx.Response
    log: Path

    def client(self, auth: str | None = f"Bearer {API_KEY}") -> httpx.Client:
        headers = {"Authorization": auth} if auth else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


def _start(
    model_dir: Path, env: dict[str, str], tmp: Path, *extra: str
) -> tuple[subprocess.Popen[str], str, Path]:
    port = _free_port()
    log = tmp / f"server-{port}.log"
    process = subprocess.Popen(
        [str(PYTHON), str(SERVER), "--host", "127.0.0.1", "--port", str(port), *extra],
        # One thread is plenty for the tiny model, and fights less with what else runs here.
        env={**os.environ, "MODEL_DIR": str(model_dir), "OMP_NUM_THREADS": "1", **env},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )
    return process, f"http://127.0.0.1:{port}", log


def _wait(url: str, process: subprocess.Popen[str], log: Path, want: int) -> list[httpx.Response]:
    """Poll /healthz until it answers ``want``; every answer seen, in order."""
    seen: list[httpx.Response] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the server exited ({process.returncode}):\n{log.read_text()}")
        try:
            response = httpx.get(f"{url}/healthz", timeout=5)
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        seen.append(response)
        if response.status_code == want:
            return seen
        time.sleep(0.1)
    pytest.fail(f"/healthz never answered {want}:\n{log.read_text()}")


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("llm-chat")
    model_dir = tmp / "model"
    subprocess.run([str(PYTHON), str(TINY), "chat", str(model_dir)], check=True, timeout=120)
    env = {
        "GPC_APP_API_KEY": API_KEY,
        "JUPYTER_TOKEN": JUPYTER_TOKEN,
        "APP_MODEL_NAME": MODEL_NAME,
    }
    # Short default answers: the page asks for no max_tokens, and a busy CPU is slow.
    process, url, log = _start(model_dir, env, tmp, "--max-new-tokens", "24")
    try:
        seen = _wait(url, process, log, 200)
        yield Served(url=url, process=process, first_health=seen[0], log=log)
    finally:
        _stop(process)
        sys.stdout.write(log.read_text())


def _events(response: httpx.Response) -> list[str]:
    """The ``data:`` payloads of a Server-Sent Events body, in order."""
    events = []
    for block in response.text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            events.append(block.removeprefix("data: "))
    return events


def _chunks(events: list[str]) -> list[dict]:
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


# Health and auth -------------------------------------------------------------------------------


def test_health_is_open_and_reports_loading_then_ok(served: Served) -> None:
    first = served.first_health
    assert first.status_code in (200, 503)
    if first.status_code == 503:  # the model loads after the socket is bound
        assert first.json()["status"] == "loading"
        assert first.json()["elapsed_s"] >= 0
    response = httpx.get(f"{served.url}/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    assert response.json()["model"] == MODEL_NAME
    assert response.json()["device"] == "cpu"


def test_models_need_the_key(served: Served) -> None:
    with served.client(auth=None) as client:
        missing = client.get("/v1/models")
    with served.client(auth="Bearer wrong-key") as client:
        wrong = client.get("/v1/models")
    with served.client(auth=f"token {API_KEY}") as client:
        key_as_jupyter_token = client.get("/v1/models")
    for response in (missing, wrong, key_as_jupyter_token):
        assert response.status_code == 401
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["code"] == "invalid_api_key"
        assert error["message"]

    with served.client() as client:
        response = client.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL_NAME]
    assert body["data"][0]["object"] == "model"


def test_jupyter_token_is_accepted(served: Served) -> None:
    with served.client(auth=f"token {JUPYTER_TOKEN}") as client:
        assert client.get("/v1/models").status_code == 200
        response = client.post("/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 5})
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"]


def test_chat_needs_the_key(served: Served) -> None:
    with served.client(auth=None) as client:
        response = client.post("/v1/chat/completions", json={"messages": QUESTION})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


# Completions -----------------------------------------------------------------------------------


def test_completion_answers_with_text_and_usage(served: Served) -> None:
    with served.client() as client:
        response = client.post(
            "/v1/chat/completions",
            json={"model": MODEL_NAME, "messages": QUESTION, "max_tokens": 12},
        )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == MODEL_NAME
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"].strip()
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0
    assert 0 < usage["completion_tokens"] <= 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_max_tokens_bounds_the_answer(served: Served) -> None:
    with served.client() as client:
        response = client.post(
            "/v1/chat/completions",
            json={"messages": QUESTION, "max_tokens": 6, "temperature": 0},
        )
    body = response.json()
    assert body["usage"]["completion_tokens"] <= 6
    assert body["choices"][0]["finish_reason"] == "length"


def test_the_default_answer_length_is_the_servers(served: Served) -> None:
    """A request without max_tokens gets --max-new-tokens (24 here)."""
    with served.client() as client:
        default = client.post("/v1/chat/completions", json={"messages": QUESTION}).json()
    assert 0 < default["usage"]["completion_tokens"] <= 24


def test_sampling_parameters_are_accepted(served: Served) -> None:
    with served.client() as client:
        response = client.post(
            "/v1/chat/completions",
            json={
                "messages": [
                    {"role": "system", "content": "you are a test model"},
                    *QUESTION,
                    {"role": "assistant", "content": "我 是 一个 测试 模型"},
                    {"role": "user", "content": [{"type": "text", "text": "hello"}]},
                ],
                "max_tokens": 8,
                "temperature": 0.8,
                "top_p": 0.9,
            },
        )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]


def test_stop_strings_cut_the_answer(served: Served) -> None:
    """Greedy answers repeat, so a word of one answer is a stop string for the same question."""
    ask = {"messages": QUESTION, "max_tokens": 12, "temperature": 0}
    with served.client() as client:
        full = client.post("/v1/chat/completions", json=ask).json()
        text = full["choices"][0]["message"]["content"]
        words = text.split()
        assert len(words) >= 3, text
        stop = words[2]
        cut = client.post("/v1/chat/completions", json={**ask, "stop": [stop]}).json()
        streamed = client.post("/v1/chat/completions", json={**ask, "stop": stop, "stream": True})
    expected = text[: text.index(stop)]
    assert cut["choices"][0]["message"]["content"] == expected
    assert cut["choices"][0]["finish_reason"] == "stop"
    chunks = _chunks(_events(streamed))
    pieces = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert pieces == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_streaming_sends_role_pieces_finish_and_done(served: Served) -> None:
    with served.client() as client:
        response = client.post(
            "/v1/chat/completions",
            json={
                "messages": QUESTION,
                "max_tokens": 10,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _events(response)
    chunks = _chunks(events)
    usage = chunks.pop()
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] > 0
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert len([p for p in pieces if p]) > 1
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"][0]["delta"] == {}


def test_streams_arrive_piece_by_piece_and_concurrent_requests_all_finish(
    served: Served,
) -> None:
    """Two streams and a plain request at once: one generates, the others wait their turn."""
    import concurrent.futures

    def stream() -> int:
        with (
            served.client() as client,
            client.stream(
                "POST",
                "/v1/chat/completions",
                json={"messages": QUESTION, "max_tokens": 20, "stream": True},
            ) as response,
        ):
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        return len(lines)

    def plain() -> str:
        with served.client() as client:
            body = client.post(
                "/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 5}
            ).json()
        return body["choices"][0]["message"]["content"]

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        streams = [pool.submit(stream), pool.submit(stream)]
        answer = pool.submit(plain)
        assert all(f.result(timeout=120) > 3 for f in streams)
        assert answer.result(timeout=120)


def test_a_client_that_goes_away_frees_the_model(served: Served) -> None:
    with (
        served.client() as client,
        client.stream(
            "POST",
            "/v1/chat/completions",
            json={"messages": QUESTION, "max_tokens": 2048, "stream": True},
        ) as response,
    ):
        next(response.iter_lines())  # the first event, then hang up
    with served.client() as client:
        started = time.monotonic()
        response = client.post("/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 4})
    assert response.status_code == 200
    assert time.monotonic() - started < 30
    deadline = time.monotonic() + 10  # the handler logs after it gave the model back
    while True:
        gone = [line for line in served.log.read_text().splitlines() if "went away" in line]
        if gone or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(gone) == 1, served.log.read_text()
    # Cancelled at the next token: far from the 500 tokens the context left room for.
    assert int(gone[0].split(" + ")[1].split()[0]) < 100


# Bad requests ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hello"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": QUESTION, "max_tokens": 0}, "max_tokens"),
        ({"messages": QUESTION, "max_tokens": "many"}, "max_tokens"),
        ({"messages": QUESTION, "temperature": 5}, "temperature"),
        ({"messages": QUESTION, "top_p": -1}, "top_p"),
        ({"messages": QUESTION, "stream": "yes"}, "stream"),
        ({"messages": QUESTION, "n": 2}, "n"),
        ({"messages": QUESTION, "stop": [1]}, "stop"),
    ],
)
def test_invalid_requests_are_400(served: Served, body: dict, param: str) -> None:
    with served.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]


def test_bad_json_is_400(served: Served) -> None:
    with served.client() as client:
        response = client.post(
            "/v1/chat/completions",
            content=b'{"messages": [',
            headers={"Content-Type": "application/json"},
        )
        not_an_object = client.post("/v1/chat/completions", json=["hello"])
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert response.json()["error"]["code"] == "invalid_json"
    assert not_an_object.status_code == 400


def test_unknown_model_is_404(served: Served) -> None:
    with served.client() as client:
        response = client.post(
            "/v1/chat/completions", json={"model": "gpt-4o", "messages": QUESTION}
        )
        card = client.get("/v1/models/gpt-4o")
        own = client.get(f"/v1/models/{MODEL_NAME}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    assert card.status_code == 404
    assert own.json()["id"] == MODEL_NAME


def test_oversize_body_is_413(served: Served) -> None:
    big = json.dumps({"messages": [{"role": "user", "content": "字" * 600_000}]})
    with served.client() as client:
        response = client.post(
            "/v1/chat/completions", content=big, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_too_long_a_prompt_is_400(served: Served) -> None:
    """The tiny model's context is 512 tokens."""
    with served.client() as client:
        response = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hello " * 600}]},
        )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_unknown_paths_are_404(served: Served) -> None:
    with served.client() as client:
        assert client.get("/v1/nothing").status_code == 404
        assert client.post("/v1/completions", json={}).status_code == 404


# The page --------------------------------------------------------------------------------------


def test_page_is_chinese_by_default_with_relative_urls(served: Served) -> None:
    with served.client(auth=f"token {JUPYTER_TOKEN}") as client:
        response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    assert '<html lang="zh-CN">' in page
    assert "大模型对话" in page
    assert "新对话" in page
    assert "OpenAI" in page
    assert MODEL_NAME in page
    for element in ('id="chat-input"', 'id="chat-send"', 'id="chat-messages"'):
        assert element in page
    assert '"msg " + role' in page  # assistant messages: class "msg assistant"
    assert 'setAttribute("data-done", "1")' in page
    # Served under the console's /instances/<id>/ports/<port>/ prefix: nothing absolute.
    assert '"v1/chat/completions"' in page
    assert '"/v1' not in page
    assert '"/' not in page
    assert "http://" not in page and "https://" not in page
    assert "Authorization" not in page


def test_page_is_english_for_english_browsers(served: Served) -> None:
    with served.client(auth=f"token {JUPYTER_TOKEN}") as client:
        response = client.get("/", headers={"Accept-Language": "en-US,en;q=0.9,zh;q=0.5"})
        chinese = client.get("/", headers={"Accept-Language": "zh-CN,zh;q=0.9,en;q=0.5"})
    assert '<html lang="en">' in response.text
    assert "New conversation" in response.text
    assert "OpenAI-compatible" in response.text
    assert "新对话" not in response.text
    assert '"/v1' not in response.text
    assert '<html lang="zh-CN">' in chinese.text


def test_page_needs_auth(served: Served) -> None:
    with served.client(auth=None) as client:
        assert client.get("/").status_code == 401


# Starting --------------------------------------------------------------------------------------


def test_refuses_to_start_without_a_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("GPC_APP_API_KEY", "JUPYTER_TOKEN")}
    result = subprocess.run(
        [str(PYTHON), str(SERVER), "--port", str(_free_port()), "--model-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "GPC_APP_API_KEY" in result.stderr


def test_a_model_that_fails_to_load_is_reported_by_healthz(tmp_path: Path) -> None:
    process, url, log = _start(tmp_path / "no-such-model", {"GPC_APP_API_KEY": API_KEY}, tmp_path)
    try:
        seen = _wait(url, process, log, 500)
        assert seen[0].status_code == 503  # loading, while torch imports
        assert seen[0].json()["status"] == "loading"
        body = seen[-1].json()
        assert body["status"] == "error"
        assert "no-such-model" in body["error"]
        assert body["model"] == "no-such-model"  # the directory's name
        response = httpx.post(
            f"{url}/v1/chat/completions",
            json={"messages": QUESTION},
            headers={"Authorization": f"Bearer {API_KEY}"},
        )
        assert response.status_code == 500
        assert response.json()["error"]["type"] == "server_error"
    finally:
        _stop(process)


# In a browser ----------------------------------------------------------------------------------


@pytest.mark.e2e
def test_chat_page_in_a_browser_behind_the_port_proxy(served: Served) -> None:
    """The page under the console's ``/instances/<id>/ports/<port>/`` prefix, the proxy emulated
    by Playwright: it strips the prefix and adds the owner's ``token`` header, as the console's
    does. Enter sends, Shift+Enter does not, answers stream in, history goes with the next turn,
    "new conversation" empties the list, and every request stays under the prefix."""
    from playwright.sync_api import Route, expect, sync_playwright

    from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

    prefix = "/instances/7/ports/8000"
    origin = "http://console.test"
    seen: list[str] = []
    bodies: list[dict] = []

    def proxy(route: Route) -> None:
        request = route.request
        seen.append(request.url)
        path = request.url.removeprefix(origin)
        if not path.startswith(prefix + "/"):
            route.fulfill(status=404, body="outside the instance's prefix")
            return
        if request.method == "POST":
            bodies.append(json.loads(request.post_data or "{}"))
        headers = {**request.headers, "authorization": f"token {JUPYTER_TOKEN}"}
        response = route.fetch(url=served.url + path.removeprefix(prefix), headers=headers)
        route.fulfill(response=response)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(locale="zh-CN")
            context.set_default_timeout(30_000)
            context.route(f"{origin}/**", proxy)
            page = context.new_page()
            page.goto(f"{origin}{prefix}/")
            expect(page.locator("#chat-model")).to_have_text(MODEL_NAME)
            expect(page.locator("#chat-send")).to_be_enabled()  # /healthz said ok
            expect(page.locator("#chat-base")).to_have_text(f"{origin}{prefix}/v1")

            page.fill("#chat-input", "你好")
            page.press("#chat-input", "Shift+Enter")
            expect(page.locator("#chat-messages .msg")).to_have_count(0)
            page.type("#chat-input", "请 介绍 一下 你 自己")
            page.press("#chat-input", "Enter")
            first = page.locator(".msg.assistant").nth(0)
            expect(first).to_have_attribute("data-done", "1")
            expect(page.locator(".msg.user").nth(0)).to_have_text("你好\n请 介绍 一下 你 自己")
            assert first.text_content().strip()
            assert "error" not in (first.get_attribute("class") or "")
            expect(page.locator("#chat-input")).to_have_value("")

            page.fill("#chat-input", "hello")
            page.click("#chat-send")
            expect(page.locator(".msg.assistant").nth(1)).to_have_attribute("data-done", "1")
            assert [m["role"] for m in bodies[-1]["messages"]] == ["user", "assistant", "user"]
            assert bodies[-1]["messages"][1]["content"] == first.text_content()
            assert all(b["stream"] is True and b["model"] == MODEL_NAME for b in bodies)

            page.click("#chat-new")
            expect(page.locator("#chat-messages .msg")).to_have_count(0)
            page.fill("#chat-input", "hello")
            page.press("#chat-input", "Enter")
            expect(page.locator(".msg.assistant")).to_have_attribute("data-done", "1")
            assert [m["role"] for m in bodies[-1]["messages"]] == ["user"]
            assert "max_tokens" not in bodies[-1]  # the server's default (--max-new-tokens)
        finally:
            browser.close()
    assert seen and all(url.startswith(f"{origin}{prefix}/") for url in seen), seen


def test_a_model_without_a_chat_template_gets_plain_role_lines(
    served: Served, tmp_path: Path
) -> None:
    """A base model (no chat template) still answers: "User: ..." lines, "Assistant:" to go on."""
    import shutil

    model_dir = tmp_path / "base-model"
    fixture_model = Path(served.log).parent / "model"
    shutil.copytree(fixture_model, model_dir)
    (model_dir / "chat_template.jinja").unlink()
    process, url, log = _start(model_dir, {"GPC_APP_API_KEY": API_KEY}, tmp_path)
    try:
        _wait(url, process, log, 200)
        response = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "base-model", "messages": QUESTION, "max_tokens": 6},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=60,
        )
    finally:
        _stop(process)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["choices"][0]["message"]["content"].strip()
    # "User: 你好 ..." then "Assistant:": more tokens than the words alone
    assert body["usage"]["prompt_tokens"] > len(QUESTION[0]["content"].split())
    assert "no chat template" in log.read_text()
    assert "its chat template" in served.log.read_text()
