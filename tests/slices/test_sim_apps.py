"""The simulated AI applications (issue 20): the same HTTP contract as the real app servers,
driven over the tunnel socket exactly as the console's port proxy drives it (one request each)."""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from collections.abc import Iterator

import h11
import pytest

from slices.drivers import sim_apps
from slices.drivers.sim_apps import open_sim_app_tunnel

KEY = "sk-sim-key-123"
TOKEN = "jupyter-token-456"
ENV = {"GPC_APP_API_KEY": KEY, "JUPYTER_TOKEN": TOKEN, "APP_MODEL_NAME": "Qwen/Qwen2.5-7B-Instruct"}
AUTH = (("Authorization", f"Bearer {KEY}"),)
PORTS = {"llm-chat": 8000, "sdxl-image": 7860, "lora-studio": 7861}


class Reply:
    def __init__(self, status: int, headers: dict[str, str], chunks: list[bytes]) -> None:
        self.status, self.headers, self.chunks = status, headers, chunks
        self.body = b"".join(chunks)

    def json(self) -> dict:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


def call(
    app: str,
    method: str = "GET",
    path: str = "/",
    *,
    port: int | None = None,
    env: dict[str, str] = ENV,
    headers: tuple[tuple[str, str], ...] = AUTH,
    body: bytes | None = None,
) -> Reply:
    """One HTTP/1.1 request over a fresh tunnel; the body's Data events kept apart."""
    sock = open_sim_app_tunnel(app, PORTS.get(app, 8888) if port is None else port, env)
    sock.settimeout(20)
    conn = h11.Connection(h11.CLIENT)
    sent = [("Host", "sim"), *headers]
    if body is not None:
        sent.append(("Content-Length", str(len(body))))
    try:
        events = [h11.Request(method=method, target=path, headers=sent)]
        events += [h11.Data(data=body)] if body else []
        for data in [conn.send(e) for e in (*events, h11.EndOfMessage())]:
            if data:  # the server may answer and close before an empty send
                sock.sendall(data)
        status, got, chunks = 0, {}, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
                got = {k.decode().lower(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return Reply(status, got, chunks)
    finally:
        sock.close()


def post_json(app: str, path: str, payload: object, **kw) -> Reply:
    return call(app, "POST", path, body=json.dumps(payload).encode(), **kw)


@pytest.fixture(autouse=True)
def _fast(monkeypatch) -> Iterator[None]:
    """Streams and images without their human-scale sleeps; a fresh run table per test."""
    monkeypatch.setattr(sim_apps, "TOKEN_DELAY", 0.001)
    monkeypatch.setattr(sim_apps, "IMAGE_DELAY", 0)
    monkeypatch.setattr(sim_apps, "_RUNS", type(sim_apps._RUNS)())
    yield


def sse(reply: Reply) -> list[str]:
    """The ``data:`` payloads of a Server-Sent Events body, in order."""
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = reply.text.split("\n\n")
    assert events[-1] == ""
    return [e.removeprefix("data: ") for e in events[:-1]]


# -- contract shared by the apps -----------------------------------------------------------------


@pytest.mark.parametrize("app", PORTS)
def test_healthz_is_open(app: str) -> None:
    reply = call(app, path="/healthz", headers=())
    assert reply.status == 200
    assert reply.json()["status"] == "ok"
    assert reply.json()["simulated"] is True


@pytest.mark.parametrize("app", PORTS)
@pytest.mark.parametrize(
    "auth",
    [
        (),
        (("Authorization", "Bearer wrong"),),
        (("Authorization", f"Bearer {TOKEN}"),),  # the Jupyter token is not the API key
        (("Authorization", f"token {KEY}"),),  # nor the other way round
        (("Authorization", f"Basic {KEY}"),),
        (("Authorization", "Bearer"),),
    ],
)
def test_401_without_the_right_key(app: str, auth: tuple) -> None:
    for path in ("/", "/nowhere"):
        reply = call(app, path=path, headers=auth)
        assert reply.status == 401
        error = reply.json()["error"]
        assert error["code"] == "invalid_api_key"
        assert error["type"] == "invalid_request_error"
        assert error["message"]


@pytest.mark.parametrize("app", PORTS)
def test_bearer_key_and_jupyter_token_both_let_in(app: str) -> None:
    assert call(app, headers=AUTH).status == 200
    assert call(app, headers=(("Authorization", f"token {TOKEN}"),)).status == 200


def test_a_key_alone_is_enough_and_no_key_is_not_started() -> None:
    only_key = {"GPC_APP_API_KEY": KEY}
    assert call("llm-chat", env=only_key).status == 200
    assert call("llm-chat", env=only_key, headers=(("Authorization", "token"),)).status == 401
    for path in ("/healthz", "/"):
        reply = call("llm-chat", path=path, env={"APP_MODEL_NAME": "x"})
        assert reply.status == 503
        assert "GPC_APP_API_KEY" in reply.json()["error"]["message"]


@pytest.mark.parametrize(
    ("app", "path"),
    [
        ("llm-chat", "/v1/chat/completions"),
        ("sdxl-image", "/v1/images/generations"),
        ("lora-studio", "/api/runs"),
    ],
)
@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"\xff\xfe", b"", b"[" * 100000])
def test_bad_json_is_400(app: str, path: str, body: bytes) -> None:
    reply = call(app, "POST", path, body=body)
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "invalid_json"


def test_body_over_1_mib_is_413() -> None:
    big = b'{"messages": "' + b"x" * (sim_apps.MAX_BODY + 10) + b'"}'
    reply = call("llm-chat", "POST", "/v1/chat/completions", body=big)
    assert reply.status == 413
    assert reply.json()["error"]["code"] == "request_too_large"


def test_unknown_path_404_and_wrong_method_405() -> None:
    assert call("llm-chat", path="/v2/whatever").status == 404
    reply = call("llm-chat", "GET", "/v1/chat/completions")
    assert reply.status == 405
    assert reply.headers["allow"] == "POST"
    assert call("llm-chat", "DELETE", "/healthz", headers=()).status == 405


def test_head_has_no_body() -> None:
    reply = call("llm-chat", "HEAD", "/")
    assert reply.status == 200
    assert reply.body == b""
    assert int(reply.headers["content-length"]) > 1000


@pytest.mark.parametrize(
    ("app", "port"), [("jupyter-workbench", 8888), ("llm-chat", 8888), ("no-such-app", 8000)]
)
def test_other_ports_and_apps_are_sim_webs_page(app: str, port: int) -> None:
    reply = call(app, port=port, headers=())
    assert reply.status == 200
    assert "(simulated)" in reply.text
    assert "sim-app" in reply.text  # sim_web's page, not one of ours
    if port == 8888:
        assert "JupyterLab (simulated)" in reply.text


def test_tensorboard_port_is_delegated() -> None:
    assert "TensorBoard (simulated)" in call("jupyter-workbench", port=6006, headers=()).text


# -- llm-chat ------------------------------------------------------------------------------------


def assert_relative_urls(page: str) -> None:
    """Every fetch, link, form and asset is relative: the proxy serves the app under a prefix."""
    assert not re.search(r"""(fetch\(|href=|src=|action=)\s*['"]?/""", page)
    assert "http://" not in page and "https://" not in page


def test_chat_page_zh_by_default() -> None:
    page = call("llm-chat", headers=(*AUTH, ("Accept-Language", "zh-CN,zh;q=0.9,en;q=0.8"))).text
    for element in ("id='chat-input'", "id='chat-send'", "id='chat-messages'"):
        assert element in page
    assert "模拟应用" in page and "simulated app" in page
    assert "lang='zh-CN'" in page
    assert '"msg " + role' in page and "dataset.done" in page
    assert 'fetch("v1/chat/completions"' in page and "getReader()" in page
    assert "Qwen/Qwen2.5-7B-Instruct" in page
    assert_relative_urls(page)
    assert call("llm-chat").text == page  # no Accept-Language: zh as well


def test_chat_page_english() -> None:
    page = call("llm-chat", headers=(*AUTH, ("Accept-Language", "en-US,en;q=0.9"))).text
    assert "lang='en'" in page
    assert "Simulated app" in page and "canned text, no model runs" in page
    assert ">Send<" in page


def test_model_name_is_escaped_in_the_page() -> None:
    env = {**ENV, "APP_MODEL_NAME": "</script><b>x</b>"}
    page = call("llm-chat", env=env).text
    assert "<b>x</b>" not in page
    assert "&lt;/script&gt;" in page and "\\u003c/script>" in page


def test_models_lists_the_chosen_model() -> None:
    reply = call("llm-chat", path="/v1/models")
    assert reply.status == 200
    assert [m["id"] for m in reply.json()["data"]] == ["Qwen/Qwen2.5-7B-Instruct"]


HOSTILE = 'say "hi" <script>alert(1)</script> \\ $(rm -rf /)'


def test_chat_not_streamed_quotes_the_user() -> None:
    reply = post_json(
        "llm-chat",
        "/v1/chat/completions",
        {
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "messages": [
                {"role": "system", "content": "be nice"},
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [{"type": "text", "text": HOSTILE}]},
            ],
        },
    )
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == "Qwen/Qwen2.5-7B-Instruct"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    assert HOSTILE in choice["message"]["content"]
    assert "模拟" in choice["message"]["content"]
    assert body["usage"]["completion_tokens"] > 10
    assert body["usage"]["total_tokens"] == (
        body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    )


def test_chat_streamed_chunks_then_done() -> None:
    reply = post_json(
        "llm-chat",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": HOSTILE}], "stream": True},
        headers=(*AUTH, ("Accept-Language", "en")),
    )
    assert reply.status == 200
    data = sse(reply)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    middle = chunks[1:-1]
    assert len(middle) > 10  # word by word
    assert all(c["choices"][0]["finish_reason"] is None for c in middle)
    text = "".join(c["choices"][0]["delta"]["content"] for c in middle)
    assert HOSTILE in text
    assert text.startswith("(Simulated answer)")
    # Each event went out as its own chunk: the stream is incremental, not one buffered body.
    assert len(reply.chunks) >= len(data)


def test_chat_stream_usage_and_length_limit() -> None:
    reply = post_json(
        "llm-chat",
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hello"}],
            "stream": True,
            "max_tokens": 3,
            "stream_options": {"include_usage": True},
        },
    )
    chunks = [json.loads(d) for d in sse(reply)[:-1]]
    contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
    assert len(contents) == 3
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"messages": []},
        {"messages": "hi"},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "robot", "content": "x"}]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "user", "content": "x"}], "stream": "yes"},
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": True},
        {"messages": [{"role": "user", "content": "x"}], "model": 7},
        {"messages": [{"role": "user", "content": "x"}] * 1000},
    ],
)
def test_chat_bad_fields_are_400(payload: dict) -> None:
    reply = post_json("llm-chat", "/v1/chat/completions", payload)
    assert reply.status == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"


def test_long_messages_are_quoted_bounded() -> None:
    reply = post_json(
        "llm-chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "w " * 5000}]}
    )
    content = reply.json()["choices"][0]["message"]["content"]
    assert len(content) < sim_apps.QUOTE_CHARS + 300


# -- sdxl-image ----------------------------------------------------------------------------------


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def png_pixels(data: bytes) -> bytes:
    """The decompressed IDAT stream (filter byte + RGB per row), checking every chunk's CRC."""
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        tag, payload = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(tag + payload) & 0xFFFFFFFF == crc
        if tag == b"IDAT":
            idat += payload
        pos += 12 + length
    assert tag == b"IEND"
    return zlib.decompress(idat)


def test_image_page() -> None:
    page = call("sdxl-image").text
    for element in ("id='prompt'", "id='generate'", "<div id='result'><img"):
        assert element in page
    assert "模拟" in page and "simulated" in page
    assert 'fetch("v1/images/generations"' in page
    assert_relative_urls(page)
    english = call("sdxl-image", headers=(*AUTH, ("Accept-Language", "en"))).text
    assert "Simulated app" in english and ">Generate<" in english


def generate(prompt: str, **more) -> Reply:
    return post_json("sdxl-image", "/v1/images/generations", {"prompt": prompt, **more})


def test_image_is_a_png_of_the_asked_size() -> None:
    reply = generate("a cat on the moon", size="256x128")
    assert reply.status == 200
    body = reply.json()
    assert body["simulated"] is True
    png = base64.b64decode(body["data"][0]["b64_json"])
    assert png_size(png) == (256, 128)
    raw = png_pixels(png)
    assert len(raw) == 128 * (1 + 3 * 256)
    assert len(set(raw)) > 50  # a picture, not a flat colour
    assert b"simulated" in png


def test_image_follows_the_prompt_and_n() -> None:
    first = generate("a red fox", size="64x64").json()["data"][0]["b64_json"]
    again = generate("a red fox", size="64x64").json()["data"][0]["b64_json"]
    other = generate("a blue whale", size="64x64").json()["data"][0]["b64_json"]
    assert first == again != other
    two = generate("a red fox", size="64x64", n=2).json()["data"]
    assert len(two) == 2 and two[0]["b64_json"] != two[1]["b64_json"]
    default = base64.b64decode(generate("x").json()["data"][0]["b64_json"])
    assert png_size(default) == (512, 512)


def test_image_max_size() -> None:
    png = base64.b64decode(generate("big", size="1024x768").json()["data"][0]["b64_json"])
    assert png_size(png) == (1024, 768)


@pytest.mark.parametrize(
    "more",
    [
        {"size": "2048x2048"},
        {"size": "1025x512"},
        {"size": "32x32"},
        {"size": "big"},
        {"size": 512},
        {"n": 0},
        {"n": 99},
        {"response_format": "url"},
        {"seed": "x"},
        {"prompt": ""},
        {"prompt": "   "},
        {"prompt": ["a"]},
        {"prompt": "x" * 5000},
    ],
)
def test_image_bad_fields_are_400(more: dict) -> None:
    reply = post_json("sdxl-image", "/v1/images/generations", {"prompt": "a cat", **more})
    assert reply.status == 400
    assert reply.json()["error"]["message"]


# -- lora-studio ---------------------------------------------------------------------------------


def test_lora_page() -> None:
    page = call("lora-studio").text
    for element in ("id='dataset'", "id='run-name'", "id='max-steps'", "id='start'"):
        assert element in page
    assert "模拟" in page and "simulated" in page
    assert 'api("api/runs"' in page and 'api("api/datasets")' in page
    assert_relative_urls(page)


def test_lora_datasets() -> None:
    data = call("lora-studio", path="/api/datasets").json()["data"]
    assert len(data) >= 2
    assert all(d["simulated"] and d["id"] and d["rows"] > 0 for d in data)


def test_lora_run_progress_follows_the_clock(monkeypatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(sim_apps, "_now", lambda: clock[0])
    start = {"name": "my-run", "dataset": "alpaca-zh-mini", "max_steps": 100}
    created = post_json("lora-studio", "/api/runs", start)
    assert created.status == 201
    assert created.json()["step"] == 0 and created.json()["status"] == "running"

    clock[0] += 5
    mid = call("lora-studio", path="/api/runs/my-run").json()
    assert 0 < mid["step"] < 100
    assert mid["status"] == "running" and mid["simulated"] is True
    clock[0] += 5
    later = call("lora-studio", path="/api/runs/my-run").json()
    assert mid["step"] < later["step"] <= 100
    assert later["loss"] < mid["loss"] < created.json()["loss"]

    clock[0] += 3600
    done = call("lora-studio", path="/api/runs/my-run").json()
    assert done["step"] == 100 and done["status"] == "completed" and done["progress"] == 1

    listed = call("lora-studio", path="/api/runs").json()["data"]
    assert [r["name"] for r in listed] == ["my-run"]


def test_lora_runs_belong_to_their_instance() -> None:
    start = {"name": "mine", "dataset": "support-faq", "max_steps": 10}
    assert post_json("lora-studio", "/api/runs", start).status == 201
    assert post_json("lora-studio", "/api/runs", start).status == 409
    other = {**ENV, "GPC_APP_API_KEY": "another-key"}
    auth = (("Authorization", "Bearer another-key"),)
    assert call("lora-studio", path="/api/runs/mine", env=other, headers=auth).status == 404
    assert call("lora-studio", path="/api/runs", env=other, headers=auth).json()["data"] == []
    assert call("lora-studio", path="/api/runs/nope").status == 404


def test_lora_run_table_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(sim_apps, "MAX_RUNS_PER_OWNER", 3)
    monkeypatch.setattr(sim_apps, "MAX_RUN_OWNERS", 2)
    for i in range(5):
        post_json("lora-studio", "/api/runs", {"name": f"r{i}", "dataset": "support-faq"})
    names = [r["name"] for r in call("lora-studio", path="/api/runs").json()["data"]]
    assert names == ["r4", "r3", "r2"]
    for key in ("k1", "k2", "k3"):
        env = {"GPC_APP_API_KEY": key}
        auth = (("Authorization", f"Bearer {key}"),)
        body = json.dumps({"name": "x", "dataset": "support-faq"}).encode()
        assert (
            call("lora-studio", "POST", "/api/runs", env=env, headers=auth, body=body).status == 201
        )
    assert len(sim_apps._RUNS) == 2


@pytest.mark.parametrize(
    "payload",
    [
        {"dataset": "support-faq"},
        {"name": "../etc", "dataset": "support-faq"},
        {"name": "-x", "dataset": "support-faq"},
        {"name": "x" * 65, "dataset": "support-faq"},
        {"name": "ok", "dataset": "nope"},
        {"name": "ok", "dataset": "support-faq", "max_steps": 0},
        {"name": "ok", "dataset": "support-faq", "max_steps": 10**6},
        {"name": "ok", "dataset": "support-faq", "max_steps": "5"},
    ],
)
def test_lora_bad_fields_are_400(payload: dict) -> None:
    reply = post_json("lora-studio", "/api/runs", payload)
    assert reply.status == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert sim_apps._RUNS == {}


# -- through the console's port proxy ------------------------------------------------------------


@pytest.mark.django_db
def test_the_chat_app_streams_through_the_port_proxy(alice, alice_client, monkeypatch) -> None:
    """The owner's browser on the app's own host: the proxy adds ``token <access_token>`` and
    relays the SSE stream chunk by chunk."""
    from slices.drivers.sim import SimDriver
    from tests.slices.test_ports import _chunks
    from tests.support.apphosts import app_host, open_app, running_with_port

    def tunnel(self, spec, node, port):
        return open_sim_app_tunnel("llm-chat", port, {"JUPYTER_TOKEN": "tok"})

    monkeypatch.setattr(SimDriver, "open_tunnel", tunnel)
    instance = running_with_port(alice, port=8000)
    app = open_app(alice_client, instance, 8000)
    page = b"".join(_chunks(app.get("/")))
    assert b"id='chat-input'" in page
    response = app.post(
        "/v1/chat/completions",
        data=json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True}),
        content_type="application/json",
        HTTP_ORIGIN=f"http://{app_host(instance, 8000)}",
    )
    assert response.status_code == 200
    chunks = _chunks(response)
    assert len(chunks) > 10  # not buffered into one
    assert b"".join(chunks).endswith(b"data: [DONE]\n\n")
