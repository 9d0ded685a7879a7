"""The simulated fleet's AI applications (issue 20): stand-ins for the marketplace apps.

On a real node an "AI application" instance runs ``marketplace/apps/<slug>/server.py`` and the
console's port proxy relays its port. The embedded default has no nodes, so the ``sim`` driver's
tunnel for such a port is served here, in-process, as one end of a socket pair (like
``slices.drivers.sim_web``): the same HTTP contract as the real servers (relative URLs, open
``/healthz``, ``Bearer <GPC_APP_API_KEY>`` / ``token <JUPYTER_TOKEN>`` auth with OpenAI-style 401
bodies, 400 on bad JSON, 413 past 1 MB), so ``make demo`` exercises the whole path through the
proxy. Everything is labelled simulated (模拟): chat answers are canned text quoting the user,
images are patterns drawn from the prompt's hash, fine-tuning progress is computed from the
clock. Nothing here touches the host: no files, no subprocesses, no network; every input, reply,
sleep and table is bounded.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import html
import json
import math
import re
import secrets
import socket
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import h11

from slices.drivers.sim_web import CHUNK, open_sim_tunnel

# The app slug's service port; any other (slug, port) is sim_web's generic simulated page.
APP_PORTS: dict[str, int] = {"llm-chat": 8000, "sdxl-image": 7860, "lora-studio": 7861}
# sim_web's names for the ports it serves (as ``SimDriver.open_tunnel`` names them).
DELEGATE_NAMES: dict[int, str] = {8888: "JupyterLab", 6006: "TensorBoard"}

MAX_BODY = 1 << 20  # request bodies, as the real servers cap them (413 beyond)
SOCKET_TIMEOUT = 60.0
DEFAULT_MODEL = "simulated-model"

# Chat: the reply is streamed word by word; both bounds keep one answer under ~15 s.
TOKEN_DELAY = 0.03
MAX_REPLY_TOKENS = 512
MAX_TOKENS_PARAM = 32768
MAX_MESSAGES = 256
QUOTE_CHARS = 200

# Images: the side bounds make the largest PNG ~3 MB raw; the delay stands for the diffusion.
IMAGE_DELAY = 0.3
MIN_SIDE, MAX_SIDE = 64, 1024
MAX_IMAGES = 4
MAX_PROMPT = 4000

# Fine-tuning: simulated speed and the size of the in-memory run table.
STEPS_PER_SECOND = 4.0
MAX_STEPS = 5000
MAX_RUN_OWNERS = 64
MAX_RUNS_PER_OWNER = 16

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SIZE = re.compile(r"(\d{1,5})x(\d{1,5})")
# One streamed "token": a CJK character, a word with its trailing spaces, or a run of spaces.
_CJK = "\u2e80-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef"
WORD = re.compile(rf"[{_CJK}]|[^\s{_CJK}]+\s*|\s+")

DATASETS: tuple[dict[str, Any], ...] = (
    {"id": "alpaca-zh-mini", "name": "Alpaca 中文 mini", "rows": 2000, "format": "instruction"},
    {"id": "support-faq", "name": "Customer support FAQ", "rows": 850, "format": "chat"},
    {"id": "text2sql-small", "name": "Text-to-SQL small", "rows": 1200, "format": "instruction"},
)

_now: Callable[[], float] = time.monotonic  # the fine-tuning clock (tests replace it)


def open_sim_app_tunnel(app: str, port: int, env: Mapping[str, str]) -> socket.socket:
    """One end of a socket pair; a daemon thread serves the other as the simulated ``app``.

    An unknown slug, or a port that is not the app's (a workbench's JupyterLab, TensorBoard),
    gets sim_web's generic simulated page, exactly as a plain instance's tunnel would.
    """
    if APP_PORTS.get(app) != port:
        return open_sim_tunnel(port, DELEGATE_NAMES.get(port, f"Web app on port {port}"))
    wanted = ("GPC_APP_API_KEY", "JUPYTER_TOKEN", "APP_MODEL_NAME", "PFS")
    own_env = {k: str(env[k]) for k in wanted if k in env}
    ours, theirs = socket.socketpair()
    thread = threading.Thread(
        target=_serve, args=(theirs, app, own_env), name=f"sim-app-{app}", daemon=True
    )
    thread.start()
    return ours


def _serve(sock: socket.socket, app: str, env: dict[str, str]) -> None:
    sock.settimeout(SOCKET_TIMEOUT)
    try:
        _App(sock, app, env).run()
    except (OSError, h11.ProtocolError):
        pass  # the client went away (or broke HTTP): nothing is owed to anyone
    finally:
        sock.close()


# -- HTTP plumbing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def lang(self) -> str:
        """zh unless the browser asks for English first (the real servers' rule)."""
        return "en" if self.headers.get("accept-language", "").strip().lower()[:2] == "en" else "zh"


class _Refused(Exception):
    """A request that was answered with an error already (bad JSON, bad field)."""


Handler = Callable[[_Request, "re.Match[str]"], None]


class _App:
    """One request on one tunnel, answered as the simulated ``app`` would."""

    def __init__(self, sock: socket.socket, app: str, env: dict[str, str]) -> None:
        self.sock, self.app, self.env = sock, app, env
        self.conn = h11.Connection(h11.SERVER)
        self.method = "GET"
        self.model = env.get("APP_MODEL_NAME") or DEFAULT_MODEL

    def _next(self) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                if self.conn.they_are_waiting_for_100_continue:
                    self._send(h11.InformationalResponse(status_code=100, headers=[]))
                self.conn.receive_data(self.sock.recv(CHUNK))
                continue
            return event

    def _send(self, *events: h11.Event) -> None:
        for event in events:
            data = self.conn.send(event)
            if data:
                self.sock.sendall(data)

    def run(self) -> None:
        try:
            request = self._read()
        except h11.RemoteProtocolError:
            self._error(400, "Malformed HTTP request.", code="bad_request")
            return
        if request is None:
            return
        with contextlib.suppress(_Refused):  # answered already
            self._dispatch(request)

    def _read(self) -> _Request | None:
        event = self._next()
        if not isinstance(event, h11.Request):
            return None
        self.method = event.method.decode("ascii", "replace").upper()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
        path = urlsplit(event.target.decode("latin-1")).path or "/"
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY:
            self._too_large()
            return None
        body = bytearray()
        while True:
            ev = self._next()
            if isinstance(ev, h11.Data):
                body += ev.data
                if len(body) > MAX_BODY:  # chunked bodies have no length to check up front
                    self._too_large()
                    return None
            elif isinstance(ev, h11.EndOfMessage | h11.ConnectionClosed):
                break
        return _Request(self.method, path, headers, bytes(body))

    def _too_large(self) -> None:
        self._error(413, f"Request body over {MAX_BODY} bytes.", code="request_too_large")
        # Read (bounded) what the client still sends: closing a socket with unread data resets
        # it, and the client would see the reset instead of the 413.
        try:
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.settimeout(2)
            left = 8 * MAX_BODY
            while left > 0:
                data = self.sock.recv(CHUNK)
                if not data:
                    break
                left -= len(data)
        except OSError:
            pass

    def _answer(
        self, status: int, ctype: str, body: bytes, extra: tuple[tuple[str, str], ...] = ()
    ) -> None:
        headers = [
            ("Content-Type", ctype),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            ("Connection", "close"),  # one request per tunnel, said out loud
            *extra,
        ]
        self._send(h11.Response(status_code=status, headers=headers))
        if self.method != "HEAD":
            self._send(h11.Data(data=body))
        self._send(h11.EndOfMessage())

    def _json(self, status: int, payload: object, extra: tuple[tuple[str, str], ...] = ()) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode()
        self._answer(status, "application/json", body, extra)

    def _error(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        kind: str = "invalid_request_error",
        extra: tuple[tuple[str, str], ...] = (),
    ) -> None:
        payload = {"error": {"message": message, "type": kind, "code": code, "simulated": True}}
        self._json(status, payload, extra)

    def _refuse(self, status: int, message: str, code: str | None = None) -> _Refused:
        self._error(status, message, code=code)
        return _Refused(message)

    def _html(self, page: str) -> None:
        self._answer(200, "text/html; charset=utf-8", page.encode())

    def _json_body(self, request: _Request) -> dict[str, Any]:
        """The body as a JSON object, or a 400 answered (and ``_Refused`` raised)."""
        try:
            data = json.loads(request.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise self._refuse(400, "The request body is not valid JSON.", "invalid_json") from None
        if not isinstance(data, dict):
            raise self._refuse(400, "The request body must be a JSON object.", "invalid_json")
        return data

    # -- routing --------------------------------------------------------------------------------

    def _dispatch(self, request: _Request) -> None:
        keys = [self.env.get("GPC_APP_API_KEY", ""), self.env.get("JUPYTER_TOKEN", "")]
        if not any(keys):
            # The real server refuses to start without a key: nothing would answer at all.
            self._error(
                503,
                "Simulated app not started: neither GPC_APP_API_KEY nor JUPYTER_TOKEN is set.",
                code="not_configured",
                kind="server_error",
            )
            return
        if request.path == "/healthz":
            if self.method not in ("GET", "HEAD"):
                self._error(405, "Method not allowed.", extra=(("Allow", "GET, HEAD"),))
                return
            status = {"status": "ok", "simulated": True, "app": self.app, "model": self.model}
            self._json(200, status)
            return
        if not self._authorized(request.headers.get("authorization", "")):
            self._error(
                401,
                "Missing or invalid API key: send 'Authorization: Bearer <GPC_APP_API_KEY>'.",
                code="invalid_api_key",
                extra=(("WWW-Authenticate", 'Bearer realm="app"'),),
            )
            return
        routes = {
            "llm-chat": self._chat_routes,
            "sdxl-image": self._image_routes,
            "lora-studio": self._lora_routes,
        }[self.app]()
        for pattern, methods in routes:
            match = re.fullmatch(pattern, request.path)
            if match is None:
                continue
            handler = methods.get("GET" if self.method == "HEAD" else self.method)
            if handler is None:
                allow = ", ".join(sorted(methods))
                self._error(405, "Method not allowed.", extra=(("Allow", allow),))
                return
            handler(request, match)
            return
        self._error(404, f"Not found: {request.path[:200]}", code="not_found")

    def _authorized(self, header: str) -> bool:
        """``Bearer <GPC_APP_API_KEY>`` or ``token <JUPYTER_TOKEN>`` (the console's proxy adds
        the latter for the owner's browser), compared in constant time."""
        scheme, _, value = header.strip().partition(" ")
        expected = {
            "bearer": self.env.get("GPC_APP_API_KEY", ""),
            "token": self.env.get("JUPYTER_TOKEN", ""),
        }.get(scheme.lower(), "")
        value = value.strip()
        if not expected or not value:
            return False
        return hmac.compare_digest(value.encode("latin-1"), expected.encode("utf-8"))

    # -- llm-chat -------------------------------------------------------------------------------

    def _chat_routes(self) -> list[tuple[str, dict[str, Handler]]]:
        return [
            ("/", {"GET": lambda r, m: self._html(chat_page(r.lang, self.model))}),
            ("/v1/models", {"GET": self._models}),
            ("/v1/chat/completions", {"POST": self._completions}),
        ]

    def _models(self, request: _Request, match: re.Match[str]) -> None:
        model = {"id": self.model, "object": "model", "created": 0, "owned_by": "simulated"}
        self._json(200, {"object": "list", "data": [model], "simulated": True})

    def _completions(self, request: _Request, match: re.Match[str]) -> None:
        data = self._json_body(request)
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise self._refuse(400, "'messages' must be a non-empty list.", "invalid_messages")
        if len(messages) > MAX_MESSAGES:
            raise self._refuse(400, f"At most {MAX_MESSAGES} messages.", "invalid_messages")
        texts: list[tuple[str, str]] = []
        for message in messages:
            role = message.get("role") if isinstance(message, dict) else None
            content = _text_content(message.get("content")) if isinstance(message, dict) else None
            if role not in ROLES or content is None:
                raise self._refuse(
                    400,
                    "Each message needs a known 'role' and a text 'content'.",
                    "invalid_messages",
                )
            texts.append((str(role), content))
        stream = data.get("stream", False)
        if not isinstance(stream, bool):
            raise self._refuse(400, "'stream' must be true or false.", "invalid_stream")
        limit = data.get("max_completion_tokens", data.get("max_tokens"))
        if limit is not None and (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 1 <= limit <= MAX_TOKENS_PARAM
        ):
            raise self._refuse(
                400,
                f"'max_tokens' must be an integer from 1 to {MAX_TOKENS_PARAM}.",
                "invalid_max_tokens",
            )
        if "model" in data and not isinstance(data["model"], str):
            raise self._refuse(400, "'model' must be a string.", "invalid_model")
        if "model" in data and data["model"] != self.model:
            # What vLLM answers for a model it does not serve (issue 29): the stand-in serves
            # the one model it was started with, as /v1/models lists it.
            self._error(
                404,
                f"The model `{data['model']}` does not exist.",
                code="model_not_found",
                kind="NotFoundError",
            )
            raise _Refused("unknown model")
        options = data.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True

        last_user = next((text for role, text in reversed(texts) if role == "user"), "")
        tokens = WORD.findall(canned_reply(last_user, self.model, request.lang))
        cap = min(limit or MAX_REPLY_TOKENS, MAX_REPLY_TOKENS)
        finish = "stop"
        if len(tokens) > cap:
            tokens, finish = tokens[:cap], "length"
        prompt_tokens = sum(len(WORD.findall(text)) for _, text in texts)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(tokens),
            "total_tokens": prompt_tokens + len(tokens),
        }
        ident, created = f"chatcmpl-sim-{secrets.token_hex(12)}", int(time.time())
        if not stream:
            message = {"role": "assistant", "content": "".join(tokens)}
            self._json(
                200,
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": self.model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                    "simulated": True,
                },
            )
            return

        def chunk(choices: list[dict[str, Any]], **more: Any) -> bytes:
            payload = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model,
                "choices": choices,
                **more,
            }
            return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

        self._send(
            h11.Response(
                status_code=200,
                headers=[
                    ("Content-Type", "text/event-stream; charset=utf-8"),
                    ("Cache-Control", "no-cache"),
                    ("X-Accel-Buffering", "no"),
                    ("Connection", "close"),
                ],
            )
        )
        role = {"role": "assistant", "content": ""}
        self._send(h11.Data(data=chunk([{"index": 0, "delta": role, "finish_reason": None}])))
        for token in tokens:
            time.sleep(TOKEN_DELAY)
            delta = {"content": token}
            self._send(h11.Data(data=chunk([{"index": 0, "delta": delta, "finish_reason": None}])))
        self._send(h11.Data(data=chunk([{"index": 0, "delta": {}, "finish_reason": finish}])))
        if include_usage:
            self._send(h11.Data(data=chunk([], usage=usage)))
        self._send(h11.Data(data=b"data: [DONE]\n\n"), h11.EndOfMessage())

    # -- sdxl-image -----------------------------------------------------------------------------

    def _image_routes(self) -> list[tuple[str, dict[str, Handler]]]:
        return [
            ("/", {"GET": lambda r, m: self._html(image_page(r.lang, self.model))}),
            ("/v1/images/generations", {"POST": self._generate}),
        ]

    def _generate(self, request: _Request, match: re.Match[str]) -> None:
        data = self._json_body(request)
        prompt = data.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT:
            raise self._refuse(
                400,
                f"'prompt' must be a non-empty string of at most {MAX_PROMPT} characters.",
                "invalid_prompt",
            )
        size = data.get("size", "512x512")
        parsed = SIZE.fullmatch(size) if isinstance(size, str) else None
        width, height = (int(parsed[1]), int(parsed[2])) if parsed else (0, 0)
        if not (MIN_SIDE <= width <= MAX_SIDE and MIN_SIDE <= height <= MAX_SIDE):
            raise self._refuse(
                400,
                f"'size' must be WIDTHxHEIGHT, each from {MIN_SIDE} to {MAX_SIDE}.",
                "invalid_size",
            )
        count = data.get("n", 1)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_IMAGES:
            raise self._refuse(400, f"'n' must be an integer from 1 to {MAX_IMAGES}.", "invalid_n")
        if data.get("response_format", "b64_json") != "b64_json":
            raise self._refuse(400, "Only response_format 'b64_json' is served.", "invalid_format")
        seed = data.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise self._refuse(400, "'seed' must be an integer.", "invalid_seed")
        time.sleep(IMAGE_DELAY)
        images = [
            {
                "b64_json": base64.b64encode(
                    simulated_png(prompt, width, height, f"{seed}/{i}")
                ).decode(),
                "revised_prompt": prompt,
            }
            for i in range(count)
        ]
        self._json(
            200,
            {"created": int(time.time()), "data": images, "model": self.model, "simulated": True},
        )

    # -- lora-studio ----------------------------------------------------------------------------

    def _lora_routes(self) -> list[tuple[str, dict[str, Handler]]]:
        return [
            ("/", {"GET": lambda r, m: self._html(lora_page(r.lang, self.model))}),
            ("/api/datasets", {"GET": self._datasets}),
            ("/api/runs", {"GET": self._runs, "POST": self._start_run}),
            (r"/api/runs/([^/]+)", {"GET": self._run}),
        ]

    @property
    def _owner(self) -> str:
        """The instance the runs belong to: a digest of its secrets (never the secrets)."""
        keys = f"{self.env.get('GPC_APP_API_KEY', '')}\0{self.env.get('JUPYTER_TOKEN', '')}"
        return hashlib.sha256(keys.encode()).hexdigest()

    def _datasets(self, request: _Request, match: re.Match[str]) -> None:
        data = [{**d, "simulated": True} for d in DATASETS]
        self._json(200, {"object": "list", "data": data, "simulated": True})

    def _runs(self, request: _Request, match: re.Match[str]) -> None:
        now = _now()
        with _RUNS_LOCK:
            runs = list(_RUNS.get(self._owner, {}).values())
        data = [run.view(now, self.env) for run in reversed(runs)]
        self._json(200, {"object": "list", "data": data, "simulated": True})

    def _run(self, request: _Request, match: re.Match[str]) -> None:
        with _RUNS_LOCK:
            run = _RUNS.get(self._owner, {}).get(match[1])
        if run is None:
            raise self._refuse(404, f"No run named {match[1][:64]!r}.", "run_not_found")
        self._json(200, run.view(_now(), self.env))

    def _start_run(self, request: _Request, match: re.Match[str]) -> None:
        data = self._json_body(request)
        name = data.get("name")
        if not isinstance(name, str) or not RUN_NAME.fullmatch(name):
            raise self._refuse(
                400,
                "'name': 1-64 letters, digits, '.', '_' or '-', starting alphanumeric.",
                "invalid_name",
            )
        dataset = data.get("dataset")
        if dataset not in {d["id"] for d in DATASETS}:
            raise self._refuse(400, "'dataset' must be one of GET api/datasets.", "invalid_dataset")
        steps = data.get("max_steps", 200)
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
            raise self._refuse(
                400, f"'max_steps' must be an integer from 1 to {MAX_STEPS}.", "invalid_max_steps"
            )
        run = _Run(name, str(dataset), steps, _now(), int(time.time()), self.model)
        with _RUNS_LOCK:
            runs = _RUNS.setdefault(self._owner, OrderedDict())
            _RUNS.move_to_end(self._owner)
            if name in runs:
                run = None
            else:
                runs[name] = run
                while len(runs) > MAX_RUNS_PER_OWNER:
                    runs.popitem(last=False)
                while len(_RUNS) > MAX_RUN_OWNERS:
                    _RUNS.popitem(last=False)
        if run is None:
            raise self._refuse(409, f"A run named {name!r} exists already.", "run_exists")
        self._json(201, run.view(_now(), self.env))


# -- fine-tuning runs (module state, bounded) ---------------------------------------------------


@dataclass(frozen=True)
class _Run:
    name: str
    dataset: str
    max_steps: int
    started: float  # on the ``_now`` clock
    created: int  # wall clock, for display
    model: str

    def view(self, now: float, env: Mapping[str, str]) -> dict[str, Any]:
        """Where the run is at ``now``: the step follows the clock, the loss a decaying curve."""
        elapsed = max(0.0, now - self.started)
        step = min(self.max_steps, int(elapsed * STEPS_PER_SECOND))
        done = step >= self.max_steps
        loss = 0.35 + 2.1 * math.exp(-4.0 * step / self.max_steps)
        eta = 0.0 if done else (self.max_steps - step) / STEPS_PER_SECOND
        return {
            "name": self.name,
            "dataset": self.dataset,
            "model": self.model,
            "status": "completed" if done else "running",
            "step": step,
            "max_steps": self.max_steps,
            "progress": round(step / self.max_steps, 4),
            "loss": round(loss, 4),
            "elapsed_s": round(elapsed, 1),
            "eta_s": round(eta, 1),
            "created": self.created,
            "output_dir": f"{env.get('PFS', '/pfs')}/lora-studio/{self.name}",
            "note": "simulated: no training runs and nothing is written",
            "simulated": True,
        }


_RUNS_LOCK = threading.Lock()
# owner digest -> run name -> run; least recently used owner first, oldest run first.
_RUNS: OrderedDict[str, OrderedDict[str, _Run]] = OrderedDict()


# -- chat text ----------------------------------------------------------------------------------


def _text_content(content: object) -> str | None:
    """A message's text: a string, or OpenAI's list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                return None
            parts.append(part["text"])
        return "".join(parts)
    return None


def canned_reply(last_user: str, model: str, lang: str) -> str:
    """The simulated answer: fixed text that quotes (a bounded slice of) the user's message."""
    quote = " ".join(last_user.split())
    if len(quote) > QUOTE_CHARS:
        quote = quote[:QUOTE_CHARS] + "…"
    if lang == "en":
        return (
            f"(Simulated answer) This is canned text from the simulated app; no model runs "
            f"({model} is not loaded). You said: \u201c{quote}\u201d. On a real node the model's "
            f"answer would stream here, word by word, just like this."
        )
    return (
        f"（模拟回答 / simulated）这是模拟应用的固定文本，没有运行任何模型（未加载 {model}）。"
        f"你刚才说：\u201c{quote}\u201d。在真实节点上，这里会逐字流式显示模型生成的回答。"
    )


# -- PNG ----------------------------------------------------------------------------------------

_ADD = tuple(bytes((i + k) & 0xFF for i in range(256)) for k in range(256))


def encode_png(width: int, height: int, rows: list[bytes], text: str = "") -> bytes:
    """An 8-bit RGB PNG of ``rows`` (each ``3 * width`` bytes), with an optional tEXt note."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    raw = b"".join(b"\x00" + row for row in rows)  # filter type 0 (None) on every row
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    note = chunk(b"tEXt", b"Comment\x00" + text.encode("latin-1", "replace")) if text else b""
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + note
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def simulated_png(prompt: str, width: int, height: int, variant: str = "") -> bytes:
    """A colourful wave pattern seeded by the prompt's hash: same prompt, same picture.

    Each channel is a horizontal wave (rolled per row, for diagonals) plus a vertical one; both
    are 0..127, so the sum never overflows a byte, and a row is three ``bytes.translate`` calls
    (C speed: a 1024x1024 picture takes milliseconds, not seconds, in pure Python).
    """
    width = max(1, min(MAX_SIDE, width))
    height = max(1, min(MAX_SIDE, height))
    seed = hashlib.sha256(f"{variant}\0{prompt}".encode()).digest()
    planes = []
    for c in range(3):
        fx, fy = 1 + seed[c] % 4, 1 + seed[3 + c] % 4
        px, py = seed[6 + c] / 255 * math.tau, seed[9 + c] / 255 * math.tau
        shear = seed[12 + c] % 5 - 2
        xs = bytes(
            int(63.5 + 63.5 * math.sin(math.tau * fx * x / width + px)) for x in range(width)
        )
        ys = [int(63.5 + 63.5 * math.sin(math.tau * fy * y / height + py)) for y in range(height)]
        planes.append((xs + xs, ys, shear))  # doubled: a roll is one slice (the wave is periodic)
    rows = []
    row = bytearray(3 * width)
    for y in range(height):
        for c, (xs2, ys, shear) in enumerate(planes):
            start = (y * shear) % width
            row[c::3] = xs2[start : start + width].translate(_ADD[ys[y]])
        rows.append(bytes(row))
    return encode_png(width, height, rows, "simulated image (GPU console demo): no model ran")


# -- pages (inline bilingual, self-contained, every URL relative) -------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,"PingFang SC","Microsoft YaHei",sans-serif;margin:0;
background:#f6f7f9;color:#1d2330}
main{max-width:860px;margin:0 auto;padding:16px}
.sim-banner{background:#fff4d6;border:1px solid #e8c35a;border-radius:6px;padding:8px 12px;
margin:0 0 12px;font-size:14px}
h1{font-size:20px;margin:8px 0}.model{color:#5b6478;font-size:13px}
textarea,input,select{font:inherit;padding:6px;border:1px solid #c5cbd6;border-radius:4px}
button{font:inherit;padding:6px 16px;border:0;border-radius:4px;background:#2f6fde;color:#fff;
cursor:pointer}button:disabled{background:#9db5e6;cursor:default}
.error{color:#b3261e}
"""


def _page(lang: str, labels: dict[str, str], model: str, body: str, script: str, css: str) -> str:
    """The shared frame: banner, title, model line; ``L`` in the script holds the labels."""
    title = labels["title"]
    data = json.dumps({**labels, "model": model}, ensure_ascii=False).replace("<", "\\u003c")
    return (
        f"<!doctype html><html lang='{'en' if lang == 'en' else 'zh-CN'}'><head>"
        "<meta charset='utf-8'><meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}{css}</style></head>"
        f"<body><main><p class='sim-banner' id='sim-banner'>{html.escape(labels['banner'])}</p>"
        f"<h1>{html.escape(title)}</h1>"
        f"<p class='model'>{html.escape(labels['model_label'])}: {html.escape(model)}</p>"
        f"{body}</main><script>const L = {data};\n{script}</script></body></html>"
    )


CHAT_LABELS = {
    "zh": {
        "title": "对话（模拟）",
        "banner": "模拟应用 / simulated app：回答是固定文本，不运行任何模型 "
        "(answers are canned text, no model runs)",
        "model_label": "模型",
        "placeholder": "输入消息，回车发送（Shift+回车换行）",
        "send": "发送",
        "error": "出错了",
    },
    "en": {
        "title": "Chat (simulated)",
        "banner": "Simulated app (模拟应用): answers are canned text, no model runs",
        "model_label": "Model",
        "placeholder": "Type a message, Enter to send (Shift+Enter for a new line)",
        "send": "Send",
        "error": "Error",
    },
}

_CHAT_CSS = """
#chat-messages{background:#fff;border:1px solid #dde1e8;border-radius:6px;min-height:320px;
max-height:60vh;overflow-y:auto;padding:12px}
.msg{white-space:pre-wrap;margin:8px 0;padding:8px 12px;border-radius:6px;max-width:85%}
.msg.user{background:#2f6fde;color:#fff;margin-left:auto}
.msg.assistant{background:#eef1f6}
.composer{display:flex;gap:8px;margin-top:12px}#chat-input{flex:1;min-height:48px}
"""

_CHAT_JS = """
const box = document.getElementById("chat-messages");
const input = document.getElementById("chat-input");
const send = document.getElementById("chat-send");
const history = [];
function add(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  box.appendChild(div);
  box.scrollTop = box.scrollHeight;
  return div;
}
async function ask() {
  const text = input.value.trim();
  if (!text || send.disabled) return;
  input.value = "";
  send.disabled = true;
  history.push({role: "user", content: text});
  add("user", text);
  const out = add("assistant", "");
  out.dataset.done = "0";
  let answer = "";
  try {
    const resp = await fetch("v1/chat/completions", {
      method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({model: L.model, messages: history.slice(-40), stream: true}),
    });
    if (!resp.ok || !resp.body) {
      let msg = L.error + " " + resp.status;
      try { msg += ": " + (await resp.json()).error.message; } catch (e) {}
      throw new Error(msg);
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buf.indexOf("\\n\\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const choice = (JSON.parse(data).choices || [])[0];
          if (choice && choice.delta && choice.delta.content) {
            answer += choice.delta.content;
            out.textContent = answer;
            box.scrollTop = box.scrollHeight;
          }
        }
      }
    }
    history.push({role: "assistant", content: answer});
  } catch (err) {
    history.pop();
    out.classList.add("error");
    out.textContent = String((err && err.message) || err);
  } finally {
    out.dataset.done = "1";
    send.disabled = false;
    input.focus();
  }
}
send.addEventListener("click", ask);
input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); ask(); }
});
"""


def chat_page(lang: str, model: str) -> str:
    """The chat page: streams answers with fetch + ReadableStream from ``v1/chat/completions``."""
    labels = CHAT_LABELS["en" if lang == "en" else "zh"]
    body = (
        "<div id='chat-messages' aria-live='polite'></div>"
        "<div class='composer'>"
        f"<textarea id='chat-input' maxlength='4000' placeholder='{html.escape(labels['placeholder'])}'>"
        "</textarea>"
        f"<button id='chat-send' type='button'>{html.escape(labels['send'])}</button></div>"
    )
    return _page(lang, labels, model, body, _CHAT_JS, _CHAT_CSS)


IMAGE_LABELS = {
    "zh": {
        "title": "文生图（模拟）",
        "banner": "模拟应用 / simulated app：图片是由提示词哈希生成的图案，不运行任何模型 "
        "(pictures are patterns drawn from the prompt's hash, no model runs)",
        "model_label": "模型",
        "prompt": "提示词",
        "placeholder": "描述你想要的图片",
        "size": "尺寸",
        "generate": "生成",
        "working": "生成中（模拟）…",
        "done": "完成（模拟图片）",
        "alt": "模拟图片",
        "error": "出错了",
    },
    "en": {
        "title": "Text to image (simulated)",
        "banner": "Simulated app (模拟应用): pictures are patterns drawn from the prompt's hash, "
        "no model runs",
        "model_label": "Model",
        "prompt": "Prompt",
        "placeholder": "Describe the picture you want",
        "size": "Size",
        "generate": "Generate",
        "working": "Generating (simulated)…",
        "done": "Done (simulated picture)",
        "alt": "Simulated picture",
        "error": "Error",
    },
}

_IMAGE_CSS = """
.form{display:flex;flex-direction:column;gap:8px}#prompt{min-height:64px}
#result{margin-top:12px;min-height:64px}#result img{max-width:100%;border-radius:6px}
#result img:not([src]){display:none}
"""

_IMAGE_JS = """
const gen = document.getElementById("generate");
const promptBox = document.getElementById("prompt");
const sizeBox = document.getElementById("size");
const img = document.querySelector("#result img");
const status = document.getElementById("status");
gen.addEventListener("click", async () => {
  const prompt = promptBox.value.trim();
  if (!prompt || gen.disabled) return;
  gen.disabled = true;
  status.className = "";
  status.textContent = L.working;
  img.dataset.done = "0";
  try {
    const resp = await fetch("v1/images/generations", {
      method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({prompt, size: sizeBox.value, n: 1, response_format: "b64_json"}),
    });
    let body = null;
    try { body = await resp.json(); } catch (e) {}
    if (!resp.ok || !body) {
      throw new Error(L.error + " " + resp.status + (body && body.error ? ": " + body.error.message : ""));
    }
    img.src = "data:image/png;base64," + body.data[0].b64_json;
    img.alt = L.alt + ": " + prompt;
    status.textContent = L.done;
  } catch (err) {
    status.className = "error";
    status.textContent = String((err && err.message) || err);
  } finally {
    img.dataset.done = "1";
    gen.disabled = false;
  }
});
"""


def image_page(lang: str, model: str) -> str:
    """The text-to-image page: posts to ``v1/images/generations``, shows the PNG inline."""
    labels = IMAGE_LABELS["en" if lang == "en" else "zh"]
    sizes = "".join(
        f"<option value='{s}'{' selected' if s == '512x512' else ''}>{s}</option>"
        for s in ("256x256", "512x512", "768x768", "1024x1024", "768x512", "512x768")
    )
    body = (
        "<div class='form'>"
        f"<label for='prompt'>{html.escape(labels['prompt'])}</label>"
        f"<textarea id='prompt' maxlength='{MAX_PROMPT}' "
        f"placeholder='{html.escape(labels['placeholder'])}'></textarea>"
        f"<label>{html.escape(labels['size'])} <select id='size'>{sizes}</select></label>"
        f"<div><button id='generate' type='button'>{html.escape(labels['generate'])}</button> "
        "<span id='status' aria-live='polite'></span></div></div>"
        f"<div id='result'><img alt='{html.escape(labels['alt'])}'></div>"
    )
    return _page(lang, labels, model, body, _IMAGE_JS, _IMAGE_CSS)


LORA_LABELS = {
    "zh": {
        "title": "LoRA 微调（模拟）",
        "banner": "模拟应用 / simulated app：训练进度按时间推算，不运行任何训练，也不写任何文件 "
        "(progress follows the clock, no training runs, nothing is written)",
        "model_label": "基础模型",
        "dataset": "数据集",
        "run_name": "运行名称",
        "max_steps": "最大步数",
        "start": "开始微调",
        "runs": "运行记录",
        "step": "步",
        "loss": "损失",
        "running": "运行中",
        "completed": "已完成",
        "error": "出错了",
    },
    "en": {
        "title": "LoRA fine-tuning (simulated)",
        "banner": "Simulated app (模拟应用): progress follows the clock, no training runs, "
        "nothing is written",
        "model_label": "Base model",
        "dataset": "Dataset",
        "run_name": "Run name",
        "max_steps": "Max steps",
        "start": "Start fine-tuning",
        "runs": "Runs",
        "step": "step",
        "loss": "loss",
        "running": "running",
        "completed": "completed",
        "error": "Error",
    },
}

_LORA_CSS = """
.form{display:grid;grid-template-columns:max-content 1fr;gap:8px 12px;align-items:center;
max-width:520px}#run{margin-top:16px}#run-progress{width:100%;height:18px}
#runs li{cursor:pointer;margin:4px 0}
"""

_LORA_JS = """
const ds = document.getElementById("dataset");
const nameBox = document.getElementById("run-name");
const steps = document.getElementById("max-steps");
const start = document.getElementById("start");
const bar = document.getElementById("run-progress");
const status = document.getElementById("run-status");
const list = document.getElementById("runs");
let timer = null;
nameBox.value = "lora-" + String(Date.now() % 100000);
async function api(path, opts) {
  const resp = await fetch(path, opts);
  let body = null;
  try { body = await resp.json(); } catch (e) {}
  if (!resp.ok || !body) {
    throw new Error(L.error + " " + resp.status + (body && body.error ? ": " + body.error.message : ""));
  }
  return body;
}
function fail(err) { status.className = "error"; status.textContent = String((err && err.message) || err); }
function render(run) {
  bar.max = run.max_steps;
  bar.value = run.step;
  status.className = "";
  status.dataset.status = run.status;
  status.dataset.step = String(run.step);
  status.textContent = run.name + " · " + L[run.status] + " · " + L.step + " " + run.step + "/" +
    run.max_steps + " · " + L.loss + " " + run.loss.toFixed(3);
}
async function refresh() {
  try {
    const body = await api("api/runs");
    list.replaceChildren(...body.data.map((run) => {
      const li = document.createElement("li");
      li.textContent = run.name + " (" + run.dataset + ", " + L[run.status] + " " + run.step + "/" + run.max_steps + ")";
      li.addEventListener("click", () => poll(run.name));
      return li;
    }));
  } catch (err) { fail(err); }
}
async function poll(name) {
  clearTimeout(timer);
  try {
    const run = await api("api/runs/" + encodeURIComponent(name));
    render(run);
    if (run.status === "running") timer = setTimeout(() => poll(name), 1000);
    else refresh();
  } catch (err) { fail(err); }
}
start.addEventListener("click", async () => {
  start.disabled = true;
  try {
    const run = await api("api/runs", {
      method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({dataset: ds.value, name: nameBox.value.trim(), max_steps: Number(steps.value)}),
    });
    render(run);
    refresh();
    poll(run.name);
    nameBox.value = "lora-" + String(Date.now() % 100000);
  } catch (err) { fail(err); } finally { start.disabled = false; }
});
(async () => {
  try {
    const body = await api("api/datasets");
    for (const d of body.data) {
      const opt = document.createElement("option");
      opt.value = d.id;
      opt.textContent = d.name + " (" + d.rows + ")";
      ds.appendChild(opt);
    }
  } catch (err) { fail(err); }
  refresh();
})();
"""


def lora_page(lang: str, model: str) -> str:
    """The fine-tuning page: a form posting to ``api/runs``, then polling the run's progress."""
    labels = LORA_LABELS["en" if lang == "en" else "zh"]
    e = {k: html.escape(v) for k, v in labels.items()}
    body = (
        "<div class='form'>"
        f"<label for='dataset'>{e['dataset']}</label><select id='dataset'></select>"
        f"<label for='run-name'>{e['run_name']}</label>"
        "<input id='run-name' maxlength='64' pattern='[A-Za-z0-9][A-Za-z0-9._-]{0,63}'>"
        f"<label for='max-steps'>{e['max_steps']}</label>"
        f"<input id='max-steps' type='number' min='1' max='{MAX_STEPS}' value='200'>"
        f"<span></span><div><button id='start' type='button'>{e['start']}</button></div></div>"
        "<div id='run'><progress id='run-progress' max='1' value='0'></progress>"
        "<p id='run-status' aria-live='polite'></p></div>"
        f"<h2>{e['runs']}</h2><ul id='runs'></ul>"
    )
    return _page(lang, labels, model, body, _LORA_JS, _LORA_CSS)
