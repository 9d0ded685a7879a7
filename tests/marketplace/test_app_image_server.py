"""The 文生图 (text to image) app's server really runs a diffusers pipeline:
marketplace/apps/sdxl-image/server.py.

The server runs as the instance runs it: a subprocess of the recipe environment's Python (torch
CPU, transformers and diffusers live there, not in the console's environment), on a free loopback
port, with a tiny Stable Diffusion pipeline made offline by ``tiny_image.py`` (random weights, a
64x64 default size). The test talks to it over HTTP with httpx, as the console's port proxy and an
OpenAI client would, and reads the PNGs it returns and saves byte by byte.
"""

from __future__ import annotations

import base64
import os
import re
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "marketplace" / "apps" / "sdxl-image" / "server.py"
TINY = Path(__file__).with_name("tiny_image.py")
VENV = Path(os.environ.get("RECIPE_VENV", ROOT / "var" / "recipe-venv"))
PYTHON = VENV / "bin" / "python"
API_KEY = "sk-test-image-key"
JUPYTER_TOKEN = "jupyter-test-token"
MODEL_NAME = "tiny-sd"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _has_diffusers() -> bool:
    return any(VENV.glob("lib/python*/site-packages/diffusers/__init__.py"))


pytestmark = [
    pytest.mark.skipif(
        not PYTHON.exists(),
        reason=f"the recipe environment ({PYTHON}) is missing: run `make recipe-env`",
    ),
    pytest.mark.skipif(
        PYTHON.exists() and not _has_diffusers(),
        reason=f"diffusers is not installed in {VENV}: run `make recipe-env` "
        "(it installs marketplace/apps/requirements.txt)",
    ),
]


# -- PNG reading (the console's environment has no Pillow: read the chunks by hand) -------------


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """Every chunk as (type, payload), checking the signature and each CRC."""
    assert data[:8] == PNG_SIGNATURE
    chunks, pos = [], 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        tag, payload = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(tag + payload) & 0xFFFFFFFF == crc, tag
        chunks.append((tag, payload))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    return chunks


def png_size(data: bytes) -> tuple[int, int]:
    width, height = struct.unpack(">II", png_chunks(data)[0][1][:8])
    return width, height


def png_text(data: bytes) -> dict[str, str]:
    """tEXt (Latin-1) and uncompressed iTXt (UTF-8) chunks: what the server writes."""
    text = {}
    for tag, payload in png_chunks(data):
        if tag == b"tEXt":
            key, _, value = payload.partition(b"\0")
            text[key.decode("latin-1")] = value.decode("latin-1")
        elif tag == b"iTXt":
            key, _, rest = payload.partition(b"\0")
            compressed, rest = rest[0], rest[2:]  # flag, method
            _language, _, rest = rest.partition(b"\0")
            _translated, _, value = rest.partition(b"\0")
            text[key.decode("latin-1")] = (zlib.decompress(value) if compressed else value).decode(
                "utf-8"
            )
    return text


# -- the server ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    url: str
    process: subprocess.Popen[str]
    first_health: httpx.Response
    outputs: Path
    log: Path

    def client(
        self, auth: str | None = f"Bearer {API_KEY}", headers: dict[str, str] | None = None
    ) -> httpx.Client:
        sent = {**(headers or {}), **({"Authorization": auth} if auth else {})}
        return httpx.Client(base_url=self.url, headers=sent, timeout=120)


def _start(
    model_dir: Path, tmp: Path, env: dict[str, str] | None = None, *extra: str
) -> tuple[subprocess.Popen[str], str, Path]:
    port = _free_port()
    log = tmp / f"server-{port}.log"
    base = {
        "GPC_APP_API_KEY": API_KEY,
        "JUPYTER_TOKEN": JUPYTER_TOKEN,
        "MODEL_DIR": str(model_dir),
        "PFS": str(tmp / "pfs"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    process = subprocess.Popen(
        [str(PYTHON), str(SERVER), "--host", "127.0.0.1", "--port", str(port), *extra],
        env={**os.environ, **base, **(env or {})},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )
    return process, f"http://127.0.0.1:{port}", log


def _wait(url: str, process: subprocess.Popen[str], log: Path, want: int) -> list[httpx.Response]:
    """Poll /healthz until it answers ``want``; every answer seen, in order."""
    seen: list[httpx.Response] = []
    deadline = time.monotonic() + 180
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


def _make_pipeline(folder: Path, *flags: str) -> None:
    started = time.monotonic()
    subprocess.run([str(PYTHON), str(TINY), str(folder), *flags], check=True, timeout=180)
    assert (folder / "model_index.json").is_file()
    # The brief: quick enough for every test run (generous under a loaded 2-core machine).
    assert time.monotonic() - started < 60


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("sdxl-image")
    model_dir = tmp / "model"
    _make_pipeline(model_dir)
    process, url, log = _start(model_dir, tmp, {"APP_MODEL_NAME": MODEL_NAME})
    try:
        seen = _wait(url, process, log, 200)
        yield Served(
            url=url,
            process=process,
            first_health=seen[0],
            outputs=tmp / "pfs" / "outputs" / "sdxl-image",
            log=log,
        )
    finally:
        _stop(process)
        sys.stdout.write(log.read_text())


def generate(served: Served, **body: Any) -> httpx.Response:
    with served.client() as client:
        return client.post("/v1/images/generations", json=body)


# -- health and auth ----------------------------------------------------------------------------


def test_health_reports_loading_then_ok(served: Served) -> None:
    # The socket is bound before torch is even imported: the console sees "loading" first.
    assert served.first_health.status_code == 503
    assert served.first_health.json()["status"] == "loading"
    health = httpx.get(f"{served.url}/healthz").json()
    assert health["status"] == "ok"
    assert health["model"] == MODEL_NAME
    assert health["pipeline"] == "StableDiffusionPipeline"
    assert health["device"] == "cpu" and health["dtype"] == "float32"
    assert health["default_size"] == "64x64"  # the UNet's sample size x the VAE's scale


def _assert_invalid_key(response: httpx.Response) -> None:
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_api_key"
    assert error["message"]


@pytest.mark.parametrize(
    "auth",
    [
        None,
        "Bearer wrong-key",
        f"Bearer {API_KEY}x",
        f"token {API_KEY}",  # the API key is a bearer key, not the proxy's token
        f"Bearer {JUPYTER_TOKEN}",
        API_KEY,
        "Bearer",
    ],
)
def test_requests_without_the_key_are_401(served: Served, auth: str | None) -> None:
    with served.client(auth) as client:
        _assert_invalid_key(client.post("/v1/images/generations", json={"prompt": "a cat"}))
        _assert_invalid_key(client.get("/"))
        _assert_invalid_key(client.get("/v1/images"))
        _assert_invalid_key(client.get("/v1/models"))
    assert httpx.get(f"{served.url}/healthz").status_code == 200  # the health check needs none


def test_models_lists_the_served_name(served: Served) -> None:
    with served.client(f"token {JUPYTER_TOKEN}") as client:
        body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL_NAME]


# -- generation ---------------------------------------------------------------------------------


def test_generation_returns_pngs_of_the_asked_size_and_saves_them(served: Served) -> None:
    prompt = "a red cat 一只红色的猫"
    response = generate(
        served,
        prompt=prompt,
        negative_prompt="blurry",
        n=2,
        size="64x128",
        steps=2,
        seed=7,
        response_format="b64_json",
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert isinstance(body["created"], int) and abs(body["created"] - time.time()) < 300
    assert body["size"] == "64x128" and body["model"] == MODEL_NAME
    assert [d["seed"] for d in body["data"]] == [7, 8]  # image i is reproducible with seed + i
    pngs = [base64.b64decode(d["b64_json"]) for d in body["data"]]
    for index, png in enumerate(pngs):
        assert png[:8] == PNG_SIGNATURE
        assert png_size(png) == (64, 128)
        text = png_text(png)
        assert text["prompt"] == prompt  # UTF-8 (iTXt): the Chinese survives
        assert text["negative_prompt"] == "blurry"
        assert text["seed"] == str(7 + index)
        assert text["steps"] == "2"
        assert text["size"] == "64x128"
    assert pngs[0] != pngs[1]

    saved = {p.read_bytes() for p in served.outputs.glob("*.png")}
    assert all(png in saved for png in pngs)  # the very bytes returned are on the PFS


def test_same_seed_same_image_and_default_size(served: Served) -> None:
    first = generate(served, prompt="an apple", steps=2, seed=42).json()["data"][0]["b64_json"]
    again = generate(served, prompt="an apple", steps=2, seed=42).json()["data"][0]["b64_json"]
    assert first == again
    png = base64.b64decode(first)
    assert png_size(png) == (64, 64)  # no size: the model's own
    random_seed = generate(served, prompt="an apple", steps=2).json()["data"][0]
    assert 0 <= random_seed["seed"] < 2**32
    assert png_text(base64.b64decode(random_seed["b64_json"]))["seed"] == str(random_seed["seed"])


@pytest.mark.parametrize(
    "more",
    [
        {"size": "2048x2048"},
        {"size": "1600x512"},
        {"size": "100x64"},  # not a multiple of 8
        {"size": "32x32"},
        {"size": "big"},
        {"size": 512},
        {"steps": 0},
        {"steps": 51},
        {"steps": 2.5},
        {"steps": "10"},
        {"num_inference_steps": 500},
        {"n": 0},
        {"n": 5},
        {"n": True},
        {"guidance_scale": -1},
        {"guidance_scale": 21},
        {"guidance_scale": "high"},
        {"seed": -1},
        {"seed": 2**32},
        {"seed": "x"},
        {"response_format": "url"},
        {"prompt": ""},
        {"prompt": "   "},
        {"prompt": ["a"]},
        {"prompt": None},
        {"prompt": "x" * 5000},
        {"negative_prompt": 3},
    ],
)
def test_bad_fields_are_400(served: Served, more: dict[str, Any]) -> None:
    response = generate(served, **{"prompt": "a cat", **more})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if len(more) == 1:
        field = next(iter(more))
        assert error["param"] == field


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"a cat"', b"\xff\xfe"])
def test_bad_bodies_are_400(served: Served, raw: bytes) -> None:
    with served.client(headers={"Content-Type": "application/json"}) as client:
        response = client.post("/v1/images/generations", content=raw)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_huge_bodies_are_413(served: Served) -> None:
    with served.client() as client:
        response = client.post(
            "/v1/images/generations", content=b'{"prompt": "' + b"x" * (2 * 1024 * 1024) + b'"}'
        )
    assert response.status_code == 413
    assert response.json()["error"]["message"]


def test_unknown_routes_are_404(served: Served) -> None:
    with served.client() as client:
        assert client.get("/v1/nothing").status_code == 404
        assert client.post("/v1/nothing", json={}).status_code == 404
        assert client.get("/v1/jobs/" + "0" * 32).status_code == 404
        assert client.get("/images/../../etc/passwd").status_code == 404
        assert client.get("/images/%2e%2e%2fserver.png").status_code == 404


# -- jobs (what the page uses) ------------------------------------------------------------------


def test_a_job_reports_progress_and_its_images(served: Served) -> None:
    with served.client(f"token {JUPYTER_TOKEN}") as client:
        created = client.post(
            "/v1/jobs", json={"prompt": "a quiet lake 湖", "steps": 3, "size": "64x64", "seed": 3}
        )
        assert created.status_code == 202, created.text
        job = created.json()
        assert re.fullmatch(r"[0-9a-f]{32}", job["id"])
        assert job["status"] in ("queued", "running", "decoding", "done")
        seen = []
        deadline = time.monotonic() + 120
        while job["status"] not in ("done", "error") and time.monotonic() < deadline:
            time.sleep(0.05)
            job = client.get(f"/v1/jobs/{job['id']}").json()
            seen.append((job["status"], job["step"]))
        assert job["status"] == "done", job
        assert job["step"] == job["total_steps"] == 3 and job["progress"] == 1.0
        assert all(step <= 3 for _, step in seen)
        assert job["seed"] == 3 and (job["width"], job["height"]) == (64, 64)
        [image] = job["images"]
        assert image["url"] == f"images/{image['name']}"  # relative to the page
        png = client.get(f"/{image['url']}")
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        assert png_size(png.content) == (64, 64)
        assert (served.outputs / image["name"]).read_bytes() == png.content

        recent = client.get("/v1/images").json()["data"]
        assert recent[0]["name"] == image["name"]
        assert recent[0]["prompt"] == "a quiet lake 湖" and recent[0]["seed"] == 3
        assert len(client.get("/v1/images?limit=1").json()["data"]) == 1


# -- the page -----------------------------------------------------------------------------------


def _assert_relative_urls(html: str) -> None:
    assert "://" not in html  # no CDN, no absolute origin
    for url in re.findall(r"""(?:src|href|action)\s*=\s*["']([^"']*)["']""", html):
        assert not url.startswith("/"), url
    for url in re.findall(r"""fetch\(\s*["'`]([^"'`]*)""", html):
        assert not url.startswith("/"), url
    assert re.search(r"""(?:api|fetch)\(\s*["'`]/""", html) is None


def test_the_page_is_self_contained_with_relative_urls(served: Served) -> None:
    with served.client(f"token {JUPYTER_TOKEN}") as client:
        zh = client.get("/")
        en = client.get("/", headers={"Accept-Language": "en-US,en;q=0.9"})
        zh_first = client.get("/", headers={"Accept-Language": "zh-CN,zh;q=0.9,en;q=0.8"})
    assert zh.status_code == 200
    assert zh.headers["content-type"].startswith("text/html")
    page = zh.text
    for element in ('id="prompt"', 'id="generate"', 'id="result"', 'id="negative"', 'id="seed"'):
        assert element in page
    assert '<html lang="zh-CN">' in page and "文生图" in page and "生成" in page
    assert "<style>" in page and "<script>" in page
    assert "fetch(path" in page and '"v1/jobs"' in page and '"healthz"' in page
    _assert_relative_urls(page)
    assert '<html lang="en">' in en.text and "Text to image" in en.text
    _assert_relative_urls(en.text)
    assert '<html lang="zh-CN">' in zh_first.text


# -- other servers: refusals, a broken model, SDXL --------------------------------------------


def test_refuses_to_start_without_credentials(tmp_path: Path) -> None:
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


def test_a_broken_model_dir_is_a_500_health(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    process, url, log = _start(tmp_path / "model", tmp_path)
    try:
        seen = _wait(url, process, log, 500)
        assert seen[-1].json()["status"] == "error"
        assert "model_index.json" in seen[-1].json()["error"]
        with httpx.Client(headers={"Authorization": f"Bearer {API_KEY}"}) as client:
            response = client.post(f"{url}/v1/images/generations", json={"prompt": "a cat"})
        assert response.status_code == 500
        assert response.json()["error"]["code"] == "model_error"
    finally:
        _stop(process)


def test_an_sdxl_pipeline_generates(tmp_path: Path) -> None:
    """The catalogue's model is SDXL: two text encoders and size conditioning, same server."""
    _make_pipeline(tmp_path / "xl", "--xl")
    process, url, log = _start(tmp_path / "xl", tmp_path)
    try:
        _wait(url, process, log, 200)
        assert httpx.get(f"{url}/healthz").json()["pipeline"] == "StableDiffusionXLPipeline"
        with httpx.Client(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as client:
            response = client.post(
                f"{url}/v1/images/generations",
                json={"prompt": "雪山", "negative_prompt": "text", "size": "64x64", "steps": 2},
            )
        assert response.status_code == 200, response.text
        png = base64.b64decode(response.json()["data"][0]["b64_json"])
        assert png_size(png) == (64, 64)
        assert list((tmp_path / "pfs" / "outputs" / "sdxl-image").glob("*.png"))
    finally:
        _stop(process)
        sys.stdout.write(log.read_text())


# -- in a browser, under the console proxy's path prefix ----------------------------------------


@pytest.mark.e2e
def test_the_page_generates_in_a_browser_under_a_prefix(served: Served) -> None:
    """Chromium opens the page at ``/instances/1/ports/7860/`` (as through the console's port
    proxy): every request the page makes must stay under that prefix and work."""
    # Debian's Chromium is a set-up dependency (make system-deps), as for every browser test:
    # missing, this fails rather than skips.
    import playwright.sync_api as playwright_api

    from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

    assert Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM}: run `make system-deps`"
    prefix = "/instances/1/ports/7860"
    outside: list[str] = []

    def proxy(route: Any) -> None:
        # The console's proxy: strip the prefix, add the owner's token, forward.
        path = route.request.url.split("://", 1)[1].split("/", 1)[1]
        path = "/" + path
        if not path.startswith(prefix + "/"):
            outside.append(path)
            route.abort()
            return
        headers = {**route.request.headers, "authorization": f"token {JUPYTER_TOKEN}"}
        response = route.fetch(url=served.url + path.removeprefix(prefix), headers=headers)
        route.fulfill(response=response)

    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(locale="zh-CN")
            context.set_default_timeout(60_000)
            context.route("http://console.test/**", proxy)
            page = context.new_page()
            page.goto(f"http://console.test{prefix}/")
            playwright_api.expect(page.locator("#generate")).to_be_enabled()
            page.fill("#prompt", "a red apple 红苹果")
            page.select_option("#width", "64")
            page.select_option("#height", "64")
            page.fill("#steps", "2")
            page.click("#generate")
            image = page.locator("#result img").first
            playwright_api.expect(image).to_be_visible()
            page.wait_for_function(
                "() => { const i = document.querySelector('#result img');"
                " return i && i.complete && i.naturalWidth === 64; }"
            )
            playwright_api.expect(page.locator("#recent img").first).to_be_visible()
            assert image.get_attribute("src").startswith("images/")
        finally:
            browser.close()
    assert outside == []
