"""大模型对话 (LLM chat): an OpenAI-compatible chat API and a chat web page for one mounted model.

The console launches this in an AI-application instance:

    python server.py --host ${GPC_BIND_ADDRESS:-127.0.0.1} --port 8000

The model is a ``save_pretrained`` directory (``--model-dir``, default env ``MODEL_DIR``) loaded
with ``AutoTokenizer`` / ``AutoModelForCausalLM``, never downloaded (``local_files_only``): on a GPU
in bf16 (fp16 where bf16 is not supported), otherwise on the CPU in fp32. Loading runs in a
background thread after the socket is bound, so ``GET /healthz`` can answer 503 ``loading`` (with
the seconds spent) while it lasts, then 200 ``ok``, or 500 with the error if loading failed.

Endpoints (everything but ``/healthz`` needs ``Authorization: Bearer <GPC_APP_API_KEY>`` or
``Authorization: token <JUPYTER_TOKEN>``; the console's port proxy adds the latter for the owner):

- ``GET /``: the chat page (self-contained, relative URLs only: it is served under any prefix).
- ``GET /v1/models``: the one model, named ``--served-name`` (env ``APP_MODEL_NAME``, else the
  model directory's name).
- ``POST /v1/chat/completions``: OpenAI's chat completions (messages, max_tokens, temperature,
  top_p, stop, stream with Server-Sent Events). One generation runs at a time; others wait.

Only the standard library's HTTP server plus torch and transformers: the image has nothing else.
"""

from __future__ import annotations

import argparse
import hmac
import html
import json
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# Request bodies beyond this are refused (413) before they are read.
MAX_BODY_BYTES = 1024 * 1024
# The most tokens one answer may have, whatever the request asks.
MAX_TOKENS_CAP = 2048
DEFAULT_MAX_TOKENS = 512
# One generation at a time: this many more requests may wait for the model, then 429.
MAX_WAITING = 32
# A generation stops after this long (finish_reason "length"), so one request cannot hold the
# model for ever while the others wait.
DEFAULT_MAX_SECONDS = 300.0
# Idle keep-alive connections are dropped after this long (each holds a thread).
SOCKET_TIMEOUT_S = 120
ROLES = {"system", "user", "assistant", "developer"}


def log(text: str) -> None:
    """One human-readable line in the instance's log."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} [llm-chat] {text}", flush=True)


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


# ---------------------------------------------------------------------------------------------
# Requests


@dataclass
class ChatRequest:
    """A validated ``/v1/chat/completions`` body."""

    messages: list[dict[str, str]]
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)


def _number(payload: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ApiError(400, f"'{name}' must be a number from {low:g} to {high:g}.", param=name)
    return float(value)


def _content(value: Any, index: int) -> str:
    """A message's text: a string, or OpenAI's list of ``{"type": "text", "text"}`` parts."""
    param = f"messages[{index}].content"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ApiError(400, "Only text content parts are supported.", param=param)
            text = part.get("text")
            if not isinstance(text, str):
                raise ApiError(400, "A text content part needs a 'text' string.", param=param)
            texts.append(text)
        return "".join(texts)
    raise ApiError(400, "A message's 'content' must be a string.", param=param)


def parse_chat_request(
    payload: Any, served_name: str, default_max_tokens: int, max_tokens_cap: int
) -> ChatRequest:
    """Check a request body; raise ``ApiError`` (400, or 404 for another model) on anything off.

    Unknown fields are ignored (clients send many); ``null`` means "not given", as OpenAI does.
    """
    if not isinstance(payload, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    model = payload.get("model")
    if model is not None and model != served_name:
        raise ApiError(
            404,
            f"The model '{model}' does not exist; this server serves '{served_name}'.",
            code="model_not_found",
            param="model",
        )
    raw = payload.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "'messages' must be a non-empty list.", param="messages")
    messages = []
    for index, message in enumerate(raw):
        if not isinstance(message, dict):
            raise ApiError(400, "Each message must be an object.", param=f"messages[{index}]")
        role = message.get("role")
        if role not in ROLES:
            raise ApiError(
                400,
                "A message's 'role' must be system, user or assistant.",
                param=f"messages[{index}].role",
            )
        # Chat templates know "system"; OpenAI's newer "developer" role means the same here.
        role = "system" if role == "developer" else role
        messages.append({"role": role, "content": _content(message.get("content"), index)})

    max_tokens = payload.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = payload.get("max_tokens")
    if max_tokens is None:
        max_tokens = default_max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ApiError(400, "'max_tokens' must be a positive integer.", param="max_tokens")
    max_tokens = min(max_tokens, max_tokens_cap)

    n = payload.get("n")
    if n is not None and n != 1:
        raise ApiError(400, "Only n=1 is supported.", param="n")
    stream = payload.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false.", param="stream")
    options = payload.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object.", param="stream_options")

    stop = payload.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list)
        or len(stop) > 4
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise ApiError(400, "'stop' must be a string or up to 4 non-empty strings.", param="stop")

    return ChatRequest(
        messages=messages,
        max_tokens=max_tokens,
        temperature=_number(payload, "temperature", 0.0, 2.0),
        top_p=_number(payload, "top_p", 0.0, 1.0),
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        stop=stop,
    )


# ---------------------------------------------------------------------------------------------
# The model


def _held_back(text: str, stops: list[str]) -> int:
    """How many trailing characters of ``text`` could be the start of a stop string.

    They are held back from the stream until the next piece shows whether a stop string follows,
    so a stop string is never sent, even when the model produces it over several tokens.
    """
    keep = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), keep, -1):
            if text.endswith(stop[:size]):
                keep = size
                break
    return keep


class Generation:
    """One answer being generated: iterate for its text pieces, then read its counts.

    ``model.generate`` runs in its own thread and feeds a ``TextIteratorStreamer``; the model's lock
    is held from ``Engine.start`` until ``close`` (always called, even when the client went away:
    it cancels the generation at the next token and waits for the thread).
    """

    def __init__(
        self,
        engine: Engine,
        inputs: dict[str, Any],
        prompt_tokens: int,
        max_new_tokens: int,
        stops: list[str],
        sampling: dict[str, Any],
    ) -> None:
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        self.engine = engine
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.completion_tokens = 0
        self.finish_reason = "stop"
        self.abandoned = False  # the client went away before the end
        self.started = time.monotonic()
        self.elapsed = 0.0
        self._stops = stops
        self._stopped_by_string = False
        self._cancel = threading.Event()
        self._error: BaseException | None = None
        self._output: Any = None
        self._closed = False
        self._drained = False  # the streamer's end was seen: iterating it again would block
        self._finished = False
        self._streamer = TextIteratorStreamer(
            engine.tokenizer, skip_prompt=True, skip_special_tokens=True
        )
        cancel = self._cancel

        class _Cancelled(StoppingCriteria):
            """Stops generating once the answer is no longer wanted."""

            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                import torch

                return torch.full(
                    (input_ids.shape[0],),
                    cancel.is_set(),
                    dtype=torch.bool,
                    device=input_ids.device,
                )

        self._kwargs: dict[str, Any] = {
            **inputs,
            **sampling,
            "max_new_tokens": max_new_tokens,
            "max_time": engine.max_seconds,
            "streamer": self._streamer,
            "stopping_criteria": StoppingCriteriaList([_Cancelled()]),
        }
        if engine.model.generation_config.pad_token_id is None:
            self._kwargs["pad_token_id"] = engine.pad_token_id
        self._thread = threading.Thread(target=self._run, name="generate", daemon=True)

    def _run(self) -> None:
        try:
            self._output = self.engine.model.generate(**self._kwargs)
        except BaseException as exc:  # reported to the client by __iter__
            self._error = exc
            self._streamer.end()

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._cancel.set()

    def __iter__(self) -> Iterator[str]:
        pending = ""
        for piece in self._streamer:
            if not piece or self._stopped_by_string:
                continue  # drain what is left after a stop string
            pending += piece
            if self._stops:
                hits = [i for i in (pending.find(s) for s in self._stops) if i >= 0]
                if hits:
                    self._stopped_by_string = True
                    self.cancel()
                    text, pending = pending[: min(hits)], ""
                else:
                    keep = _held_back(pending, self._stops)
                    cut = len(pending) - keep
                    text, pending = pending[:cut], pending[cut:]
            else:
                text, pending = pending, ""
            if text:
                yield text
        self._drained = True
        if pending and not self._stopped_by_string:
            yield pending
        self._finish()
        if self._error is not None:
            raise ApiError(
                500,
                f"Generation failed: {self._error}",
                type_="server_error",
                code="generation_failed",
            )

    def _finish(self) -> None:
        """Counts and finish reason, once the generate thread is done."""
        if self._finished:
            return
        self._finished = True
        self._thread.join()
        self.elapsed = time.monotonic() - self.started
        output = self._output
        if output is None:
            return
        sequence = output[0]
        self.completion_tokens = max(0, int(sequence.shape[-1]) - self.prompt_tokens)
        ended = self.completion_tokens > 0 and int(sequence[-1]) in self.engine.eos_ids
        self.finish_reason = "stop" if ended or self._stopped_by_string else "length"

    def close(self) -> None:
        """Cancel if still running, wait for the thread, give the model to the next request."""
        if self._closed:
            return
        self._closed = True
        self.cancel()
        try:
            if not self._drained:
                for _ in self._streamer:
                    pass
                self._drained = True
            if self._thread.ident is not None:
                self._finish()
        finally:
            self.engine.release()


class Engine:
    """The tokenizer and the model, loaded once in a background thread, used by one at a time."""

    def __init__(
        self, model_dir: str, served_name: str, max_seconds: float, trust_remote_code: bool = False
    ) -> None:
        self.model_dir = model_dir
        self.trust_remote_code = trust_remote_code
        self.served_name = served_name
        self.max_seconds = max_seconds
        self.created = int(time.time())
        self.state = "loading"
        self.error = ""
        self.load_started = time.monotonic()
        self.load_seconds = 0.0
        self.device = ""
        self.dtype = ""
        self.tokenizer: Any = None
        self.model: Any = None
        self.has_template = False
        self.eos_ids: set[int] = set()
        self.pad_token_id: int | None = None
        self.context_length: int | None = None
        self._lock = threading.Lock()
        self._queue = threading.Lock()
        self._waiting = 0

    # Loading ---------------------------------------------------------------------------------

    def load_in_background(self) -> None:
        threading.Thread(target=self._load, name="load-model", daemon=True).start()

    def _load(self) -> None:
        try:
            self._load_model()
        except BaseException as exc:  # shown by /healthz; the server stays up to report it
            self.error = f"{type(exc).__name__}: {exc}"
            self.state = "error"
            log(f"loading the model failed: {self.error}")
            return
        self.load_seconds = time.monotonic() - self.load_started
        self.state = "ready"
        log(
            f"model {self.served_name} loaded in {self.load_seconds:.1f} s "
            f"({self.device}, {self.dtype}, context {self.context_length or 'unknown'}, "
            f"{'its chat template' if self.has_template else 'no chat template: plain role lines'})"
        )

    def _load_model(self) -> None:
        # Imported here, not at the top: torch takes seconds to import, and the socket must answer
        # /healthz ("loading") meanwhile.
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # progress bars are noise in the instance's log
        if not Path(self.model_dir).is_dir():
            raise FileNotFoundError(f"model directory {self.model_dir} does not exist")
        # Transformers 4.56 renamed torch_dtype to dtype; images may ship an older one.
        major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
        dtype_arg = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
        if torch.cuda.is_available():
            dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
            options: dict[str, Any] = {dtype_arg: dtype, "device_map": "auto"}
            self.device = f"cuda x{torch.cuda.device_count()}"
        else:
            dtype = torch.float32
            options = {dtype_arg: dtype}
            self.device = "cpu"
        self.dtype = str(dtype).removeprefix("torch.")
        log(f"loading {self.model_dir} on {self.device} ({self.dtype})")
        # Remote code (the model directory's own modelling files, e.g. ChatGLM3, Baichuan2) runs
        # only when the manifest asks for it: it executes whatever Python the directory holds.
        remote = {"trust_remote_code": True} if self.trust_remote_code else {}
        tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True, **remote)
        model = AutoModelForCausalLM.from_pretrained(
            self.model_dir, local_files_only=True, **options, **remote
        )
        model.eval()

        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else next(iter(sorted(eos_ids)), None)
        self.eos_ids = eos_ids
        self.context_length = getattr(model.config, "max_position_embeddings", None)
        self.has_template = bool(getattr(tokenizer, "chat_template", None))
        self.tokenizer, self.model = tokenizer, model

    def health(self) -> tuple[int, dict[str, Any]]:
        if self.state == "ready":
            return 200, {
                "status": "ok",
                "model": self.served_name,
                "device": self.device,
                "dtype": self.dtype,
                "load_s": round(self.load_seconds, 1),
            }
        if self.state == "error":
            return 500, {"status": "error", "model": self.served_name, "error": self.error}
        elapsed = time.monotonic() - self.load_started
        return 503, {"status": "loading", "model": self.served_name, "elapsed_s": round(elapsed, 1)}

    # Generating ------------------------------------------------------------------------------

    def start(self, request: ChatRequest) -> Generation:
        """Wait for the model, then start generating; the caller must ``close`` the result."""
        if self.state == "error":
            raise ApiError(500, f"The model failed to load: {self.error}", type_="server_error")
        if self.state != "ready":
            raise ApiError(
                503,
                "The model is still loading; try again shortly.",
                type_="server_error",
                code="model_loading",
            )
        with self._queue:
            if self._waiting >= MAX_WAITING:
                raise ApiError(
                    429,
                    "Too many requests are waiting for the model; try again shortly.",
                    type_="rate_limit_error",
                    code="server_busy",
                )
            self._waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._queue:
                self._waiting -= 1
        try:
            generation = self._prepare(request)
            generation.start()
        except BaseException:
            self._lock.release()
            raise
        return generation

    def release(self) -> None:
        self._lock.release()

    def prompt(self, messages: list[dict[str, str]]) -> tuple[str, bool, list[str]]:
        """The prompt text, whether the tokenizer should add its special tokens, extra stops.

        A chat template (the model's own turn format) is used when the tokenizer has one; a base
        model without one gets plain "Role: text" lines, and its answer is cut where it starts
        writing the user's next line.
        """
        if self.has_template:
            try:
                text = self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=False
                )
            except Exception as exc:  # e.g. a template that allows no system message
                raise ApiError(
                    400, f"The model's chat template refused the messages: {exc}"
                ) from exc
            return str(text), False, []
        names = {"system": "System", "user": "User", "assistant": "Assistant"}
        lines = [f"{names[m['role']]}: {m['content']}" for m in messages]
        return "\n".join([*lines, "Assistant:"]), True, ["\nUser:"]

    def _prepare(self, request: ChatRequest) -> Generation:
        text, special, extra_stops = self.prompt(request.messages)
        encoded = self.tokenizer(text, return_tensors="pt", add_special_tokens=special)
        inputs = {
            "input_ids": encoded["input_ids"].to(self.model.device),
            "attention_mask": encoded["attention_mask"].to(self.model.device),
        }
        prompt_tokens = int(inputs["input_ids"].shape[-1])
        max_new = request.max_tokens
        if self.context_length:
            room = self.context_length - prompt_tokens
            if room < 1:
                raise ApiError(
                    400,
                    f"The messages take {prompt_tokens} tokens; this model's context is "
                    f"{self.context_length} tokens.",
                    code="context_length_exceeded",
                    param="messages",
                )
            max_new = min(max_new, room)
        # Sampling: what the request asks; what it leaves out follows the model's own
        # generation_config (its authors' recommended settings). temperature 0 is greedy.
        sampling: dict[str, Any] = {}
        if request.temperature == 0:
            sampling["do_sample"] = False
        elif request.temperature is not None or request.top_p is not None:
            sampling["do_sample"] = True
            if request.temperature is not None:
                sampling["temperature"] = request.temperature
            if request.top_p is not None:
                sampling["top_p"] = max(request.top_p, 1e-6)
        return Generation(
            self, inputs, prompt_tokens, max_new, [*request.stop, *extra_stops], sampling
        )


# ---------------------------------------------------------------------------------------------
# The page

LABELS: dict[str, dict[str, str]] = {
    "zh": {
        "html_lang": "zh-CN",
        "title": "大模型对话",
        "new": "新对话",
        "send": "发送",
        "stop": "停止",
        "placeholder": "输入消息，Enter 发送，Shift+Enter 换行",
        "api_note": "接口与 OpenAI 兼容，地址：",
        "api_key": "调用时用应用的 API 密钥作 Bearer 令牌。",
        "empty": "输入一句话，开始对话。",
        "loading": "模型加载中…",
        "ready": "就绪",
        "failed": "模型加载失败：",
        "error": "出错了：",
        "stopped": "（已停止）",
        "you": "你",
        "assistant": "助手",
    },
    "en": {
        "html_lang": "en",
        "title": "LLM chat",
        "new": "New conversation",
        "send": "Send",
        "stop": "Stop",
        "placeholder": "Type a message; Enter sends, Shift+Enter starts a new line",
        "api_note": "The API is OpenAI-compatible, base URL:",
        "api_key": "Use the app's API key as the Bearer token.",
        "empty": "Type something to start the conversation.",
        "loading": "Loading the model…",
        "ready": "Ready",
        "failed": "The model failed to load: ",
        "error": "Error: ",
        "stopped": "(stopped)",
        "you": "You",
        "assistant": "Assistant",
    },
}


def page_language(accept_language: str | None) -> str:
    """English when the browser's first choice is English, Chinese otherwise."""
    return "en" if (accept_language or "").strip().lower().startswith("en") else "zh"


PAGE_STYLE = """
*{box-sizing:border-box}
html,body{height:100%;margin:0}
body{display:flex;flex-direction:column;font:15px/1.6 -apple-system,BlinkMacSystemFont,"Segoe UI",
"PingFang SC","Microsoft YaHei",sans-serif;color:#1f2328;background:#f6f7f9}
header{display:flex;align-items:center;gap:12px;padding:10px 16px;background:#fff;
border-bottom:1px solid #e3e6ea}
header h1{font-size:16px;margin:0}
#chat-model{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px;color:#57606a}
#chat-status{font-size:12px;padding:1px 8px;border-radius:10px;background:#fff4d6;color:#7a5a00}
#chat-status.ok{background:#dcf5e3;color:#1a7f37}
#chat-status.bad{background:#ffe1e1;color:#b42318}
header .spacer{flex:1}
button{font:inherit;border:1px solid #d0d7de;background:#fff;border-radius:6px;padding:6px 14px;
cursor:pointer}
button:disabled{opacity:.5;cursor:default}
#chat-send{background:#2563eb;border-color:#2563eb;color:#fff}
.note{margin:0;padding:6px 16px;font-size:12px;color:#57606a;background:#fff;
border-bottom:1px solid #e3e6ea}
.note code{font-family:ui-monospace,Menlo,Consolas,monospace;background:#f0f2f5;padding:0 4px;
border-radius:4px}
#chat-messages{flex:1;overflow-y:auto;padding:16px;display:flex;flex-direction:column;gap:12px}
#chat-messages:empty::before{content:attr(data-empty);color:#8c959f;margin:auto}
.msg{max-width:min(760px,90%);padding:8px 12px;border-radius:10px;white-space:pre-wrap;
word-break:break-word;background:#fff;border:1px solid #e3e6ea}
.msg::before{content:attr(data-label);display:block;font-size:12px;color:#8c959f}
.msg.user{align-self:flex-end;background:#e8f0fe;border-color:#c9dafc}
.msg.assistant{align-self:flex-start}
.msg.assistant:not([data-done]):empty::after{content:"…";color:#8c959f}
.msg.error{border-color:#f5b5b5;color:#b42318}
.composer{display:flex;gap:8px;padding:12px 16px;background:#fff;border-top:1px solid #e3e6ea}
#chat-input{flex:1;resize:vertical;min-height:44px;max-height:40vh;font:inherit;padding:8px;
border:1px solid #d0d7de;border-radius:6px}
.actions{display:flex;flex-direction:column;gap:6px;justify-content:flex-end}
"""

# Relative URLs only ("v1/...", "healthz"): the page is served under the console's port-proxy
# prefix. No Authorization header: the proxy adds the owner's.
PAGE_SCRIPT = """
(function () {
  "use strict";
  var L = JSON.parse(document.getElementById("chat-labels").textContent);
  var model = document.body.getAttribute("data-model");
  var list = document.getElementById("chat-messages");
  var input = document.getElementById("chat-input");
  var send = document.getElementById("chat-send");
  var stop = document.getElementById("chat-stop");
  var status = document.getElementById("chat-status");
  var history = [];
  var busy = false;
  var ready = false;
  var controller = null;

  document.getElementById("chat-base").textContent = new URL("v1", location.href).href;

  function setStatus(text, cls) {
    status.textContent = text;
    status.className = cls || "";
  }
  function refresh() {
    send.disabled = busy || !ready;
    stop.hidden = !busy;
  }
  function scroll() { list.scrollTop = list.scrollHeight; }
  function bubble(role) {
    var el = document.createElement("div");
    el.className = "msg " + role;
    el.setAttribute("data-label", role === "user" ? L.you : L.assistant);
    list.appendChild(el);
    scroll();
    return el;
  }

  function poll() {
    fetch("healthz", {cache: "no-store"}).then(function (r) {
      return r.json().then(function (body) { return [r.status, body]; });
    }).then(function (res) {
      if (res[0] === 200) { ready = true; setStatus(L.ready, "ok"); refresh(); return; }
      if (res[0] === 500) { setStatus(L.failed + (res[1].error || ""), "bad"); return; }
      setStatus(L.loading + " " + Math.round(res[1].elapsed_s || 0) + " s");
      setTimeout(poll, 2000);
    }).catch(function () { setTimeout(poll, 3000); });
  }

  async function errorText(resp) {
    try {
      var body = await resp.json();
      if (body && body.error && body.error.message) { return body.error.message; }
    } catch (e) { /* not JSON */ }
    return resp.status + " " + resp.statusText;
  }

  async function ask() {
    var text = input.value;
    if (busy || !ready || !text.trim()) { return; }
    input.value = "";
    bubble("user").textContent = text;
    history.push({role: "user", content: text});
    var el = bubble("assistant");
    var answer = "";
    var mine = new AbortController();
    controller = mine;
    busy = true;
    refresh();
    try {
      var resp = await fetch("v1/chat/completions", {
        method: "POST",
        headers: {"Content-Type": "application/json"},
        body: JSON.stringify({model: model, messages: history, stream: true}),
        signal: mine.signal
      });
      if (!resp.ok) { throw new Error(await errorText(resp)); }
      var reader = resp.body.getReader();
      var decoder = new TextDecoder();
      var buffer = "";
      var finished = false;
      while (!finished) {
        var chunk = await reader.read();
        if (chunk.done) { break; }
        buffer += decoder.decode(chunk.value, {stream: true});
        var cut;
        while (!finished && (cut = buffer.indexOf("\\n\\n")) >= 0) {
          var event = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          event.split("\\n").forEach(function (line) {
            if (finished || line.indexOf("data:") !== 0) { return; }
            var data = line.slice(5).trim();
            if (data === "[DONE]") { finished = true; return; }
            var msg = JSON.parse(data);
            if (msg.error) { throw new Error(msg.error.message); }
            var delta = msg.choices && msg.choices[0] && msg.choices[0].delta;
            if (delta && delta.content) {
              answer += delta.content;
              el.textContent = answer;
              scroll();
            }
          });
        }
      }
      history.push({role: "assistant", content: answer});
    } catch (err) {
      if (mine.signal.aborted) {
        if (answer) { history.push({role: "assistant", content: answer}); }
        el.textContent = answer + (answer ? " " : "") + L.stopped;
      } else {
        history.pop();
        el.classList.add("error");
        el.textContent = L.error + (err && err.message ? err.message : String(err));
      }
    } finally {
      el.setAttribute("data-done", "1");
      if (controller === mine) {
        controller = null;
        busy = false;
        refresh();
      }
      scroll();
    }
  }

  send.addEventListener("click", ask);
  stop.addEventListener("click", function () { if (controller) { controller.abort(); } });
  input.addEventListener("keydown", function (e) {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
      e.preventDefault();
      ask();
    }
  });
  document.getElementById("chat-new").addEventListener("click", function () {
    if (controller) { controller.abort(); controller = null; }
    busy = false;
    history = [];
    list.textContent = "";
    refresh();
    input.focus();
  });
  refresh();
  poll();
  input.focus();
})();
"""


def render_page(language: str, model_name: str) -> bytes:
    """The chat page, every label in ``language``; self-contained (inline CSS and JS)."""
    labels = LABELS[language]
    text = {key: html.escape(value) for key, value in labels.items()}
    # JSON inside <script>: "<" escaped so no text can close the element.
    labels_json = json.dumps(labels, ensure_ascii=False).replace("<", "\\u003c")
    name = html.escape(model_name)
    document = f"""<!doctype html>
<html lang="{text["html_lang"]}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{text["title"]} · {name}</title>
<style>{PAGE_STYLE}</style>
</head>
<body data-model="{name}">
<header>
<h1>{text["title"]}</h1>
<span id="chat-model">{name}</span>
<span id="chat-status">{text["loading"]}</span>
<span class="spacer"></span>
<button id="chat-new" type="button">{text["new"]}</button>
</header>
<p class="note">{text["api_note"]} <code id="chat-base">v1</code> {text["api_key"]}</p>
<div id="chat-messages" aria-live="polite" data-empty="{text["empty"]}"></div>
<div class="composer">
<textarea id="chat-input" rows="3" placeholder="{text["placeholder"]}"></textarea>
<div class="actions">
<button id="chat-stop" type="button" hidden>{text["stop"]}</button>
<button id="chat-send" type="button" disabled>{text["send"]}</button>
</div>
</div>
<script type="application/json" id="chat-labels">{labels_json}</script>
<script>{PAGE_SCRIPT}</script>
</body>
</html>
"""
    return document.encode("utf-8")


# ---------------------------------------------------------------------------------------------
# HTTP

PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _too_large(length: int) -> ApiError:
    return ApiError(
        413,
        f"The request body is {length} bytes; the limit is {MAX_BODY_BYTES}.",
        code="request_too_large",
    )


class AppServer(ThreadingHTTPServer):
    """The HTTP server with what the handlers share: the engine and the accepted credentials."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        engine: Engine,
        api_key: str,
        jupyter_token: str,
        default_max_tokens: int,
    ) -> None:
        super().__init__(address, Handler)
        self.engine = engine
        self.api_key = api_key
        self.jupyter_token = jupyter_token
        self.default_max_tokens = default_max_tokens


class Handler(BaseHTTPRequestHandler):
    """Routes, auth, bounded bodies, JSON and Server-Sent Events."""

    # Every small write (headers, each streamed chunk) goes out at once: Nagle's algorithm
    # would hold it for the client's delayed acknowledgement (~40 ms on a kept-alive connection).
    disable_nagle_algorithm = True

    protocol_version = "HTTP/1.1"
    server_version = "gpc-llm-chat/1.0"
    timeout = SOCKET_TIMEOUT_S
    server: AppServer

    # Plumbing --------------------------------------------------------------------------------

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if self.path != "/healthz":  # the console polls it; not worth a line each time
            log(f"{self.command} {urlsplit(self.path).path} {code}")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        log(format % args)

    def handle_expect_100(self) -> bool:
        """Refuse an oversized body before the client sends it (``Expect: 100-continue``)."""
        self._body_read = False
        length = self.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            self._error(_too_large(int(length)))
            return False
        return super().handle_expect_100()

    def _route(self) -> str:
        path = urlsplit(self.path).path
        return path if path == "/" else path.rstrip("/")

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        if self.command == "POST" and not getattr(self, "_body_read", False):
            # An unread request body would be taken for the next request on this connection.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self._send(status, body, "application/json; charset=utf-8", headers or {})

    def _error(self, error: ApiError) -> None:
        headers = {"Retry-After": "5"} if error.status in (429, 503) else {}
        if error.code == "invalid_api_key":
            headers["WWW-Authenticate"] = 'Bearer realm="llm-chat"'
        self._json(error.status, error.body(), headers)

    def _authorized(self) -> bool:
        """``Bearer <GPC_APP_API_KEY>`` or ``token <JUPYTER_TOKEN>``, compared in constant time."""
        scheme, _, value = self.headers.get("Authorization", "").strip().partition(" ")
        expected = {"bearer": self.server.api_key, "token": self.server.jupyter_token}.get(
            scheme.lower(), ""
        )
        if not expected:
            return False
        return hmac.compare_digest(value.strip().encode("utf-8"), expected.encode("utf-8"))

    def _check_auth(self) -> bool:
        if self._authorized():
            return True
        given = bool(self.headers.get("Authorization"))
        message = (
            "Incorrect API key provided."
            if given
            else "No API key provided: send 'Authorization: Bearer <API key>'."
        )
        self._error(ApiError(401, message, code="invalid_api_key"))
        return False

    def _read_json(self) -> Any:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise ApiError(411, "Send the body with a Content-Length.")
        raw_length = self.headers.get("Content-Length", "0") or "0"
        try:
            length = int(raw_length)
        except ValueError:
            raise ApiError(400, "Content-Length is not a number.") from None
        if length < 0:
            raise ApiError(400, "Content-Length is not a number.")
        if length > MAX_BODY_BYTES:
            raise _too_large(length)
        body = self.rfile.read(length) if length else b""
        self._body_read = len(body) == length
        if not self._body_read:
            raise ApiError(400, "The request body ended early.")
        try:
            return json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ApiError(
                400, "The request body is not valid JSON.", code="invalid_json"
            ) from None

    # Routes ----------------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        route = self._route()
        if route == "/healthz":
            status, payload = self.server.engine.health()
            self._json(status, payload, {"Cache-Control": "no-store"})
            return
        if not self._check_auth():
            return
        engine = self.server.engine
        if route in ("/", "/index.html"):
            language = page_language(self.headers.get("Accept-Language"))
            page = render_page(language, engine.served_name)
            headers = {**PAGE_HEADERS, "Content-Language": LABELS[language]["html_lang"]}
            self._send(200, page, "text/html; charset=utf-8", headers)
        elif route == "/v1/models":
            self._json(200, {"object": "list", "data": [self._model_card()]})
        elif route == f"/v1/models/{engine.served_name}":
            self._json(200, self._model_card())
        elif route.startswith("/v1/models/"):
            self._error(
                ApiError(404, "The model does not exist.", code="model_not_found", param="model")
            )
        else:
            self._error(ApiError(404, f"No such path: {route}", code="not_found"))

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self._body_read = False
        route = self._route()
        if route == "/healthz":
            self._error(ApiError(405, "Use GET.", code="method_not_allowed"))
            return
        if not self._check_auth():
            return
        if route != "/v1/chat/completions":
            self._error(ApiError(404, f"No such path: {route}", code="not_found"))
            return
        try:
            server = self.server
            request = parse_chat_request(
                self._read_json(),
                server.engine.served_name,
                server.default_max_tokens,
                MAX_TOKENS_CAP,
            )
            generation = server.engine.start(request)
        except ApiError as error:
            self._error(error)
            return
        try:
            if request.stream:
                self._stream(request, generation)
            else:
                self._complete(generation)
        finally:
            generation.close()
        rate = generation.completion_tokens / generation.elapsed if generation.elapsed else 0.0
        ending = (
            "the client went away" if generation.abandoned else f"finish {generation.finish_reason}"
        )
        log(
            f"chat{' (stream)' if request.stream else ''}: {generation.prompt_tokens} prompt + "
            f"{generation.completion_tokens} completion tokens in {generation.elapsed:.2f} s "
            f"({rate:.1f} tokens/s), {ending}"
        )

    def _model_card(self) -> dict[str, Any]:
        engine = self.server.engine
        return {
            "id": engine.served_name,
            "object": "model",
            "created": engine.created,
            "owned_by": "gpc",
        }

    def _envelope(self, request_id: str, created: int, kind: str) -> dict[str, Any]:
        return {
            "id": request_id,
            "object": kind,
            "created": created,
            "model": self.server.engine.served_name,
            "system_fingerprint": None,
        }

    @staticmethod
    def _usage(generation: Generation) -> dict[str, int]:
        return {
            "prompt_tokens": generation.prompt_tokens,
            "completion_tokens": generation.completion_tokens,
            "total_tokens": generation.prompt_tokens + generation.completion_tokens,
        }

    def _complete(self, generation: Generation) -> None:
        request_id, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        try:
            text = "".join(generation)
        except ApiError as error:
            self._error(error)
            return
        answer = self._envelope(request_id, created, "chat.completion")
        answer["choices"] = [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": generation.finish_reason,
            }
        ]
        answer["usage"] = self._usage(generation)
        self._json(200, answer)

    def _stream(self, request: ChatRequest, generation: Generation) -> None:
        """Server-Sent Events in HTTP/1.1 chunks: role, content pieces, finish reason, [DONE]."""
        request_id, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            body = self._envelope(request_id, created, "chat.completion.chunk")
            body["choices"] = [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            ]
            return body

        def event(payload: Any) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
            frame = f"data: {data}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("X-Accel-Buffering", "no")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            event(chunk({"role": "assistant", "content": ""}))
            try:
                for piece in generation:
                    event(chunk({"content": piece}))
            except ApiError as error:
                event(error.body())
            else:
                event(chunk({}, generation.finish_reason))
                if request.include_usage:
                    usage = self._envelope(request_id, created, "chat.completion.chunk")
                    usage["choices"] = []
                    usage["usage"] = self._usage(generation)
                    event(usage)
            event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            # The client went away: stop generating, drop the connection.
            generation.abandoned = True
            generation.cancel()
            self.close_connection = True


# ---------------------------------------------------------------------------------------------
# Command line


def resolve(path: str) -> Path:
    """A path as the container sees it (/models/..., /pfs/...). On a bare host (the console's
    ``runtime=process``) the instance's directory, the working directory, stands in for the
    container's root: the mounts and /pfs are links there."""
    p = Path(path)
    if not path or p.exists() or not p.is_absolute():
        return p
    inside = Path.cwd() / path.lstrip("/")
    return inside if inside.exists() else p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="OpenAI-compatible chat server for one model.")
    parser.add_argument("--host", default=os.environ.get("GPC_BIND_ADDRESS") or "127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--model-dir",
        default=os.environ.get("MODEL_DIR", ""),
        help="the save_pretrained directory (default: env MODEL_DIR)",
    )
    parser.add_argument(
        "--served-name",
        default=os.environ.get("APP_MODEL_NAME", ""),
        help="the model's name in the API (default: env APP_MODEL_NAME, else the directory name)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"answer length when a request sets no max_tokens (at most {MAX_TOKENS_CAP})",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=DEFAULT_MAX_SECONDS,
        help="the longest one generation may run",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        default=os.environ.get("APP_TRUST_REMOTE_CODE", "") == "1",
        help="run the model directory's own Python (models such as ChatGLM3 or Baichuan2 need it; "
        "default: env APP_TRUST_REMOTE_CODE=1)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    api_key = os.environ.get("GPC_APP_API_KEY", "")
    jupyter_token = os.environ.get("JUPYTER_TOKEN", "")
    if not api_key and not jupyter_token:
        print(
            "llm-chat: set GPC_APP_API_KEY or JUPYTER_TOKEN; refusing to serve without a key.",
            file=sys.stderr,
        )
        return 2
    if not args.model_dir:
        print("llm-chat: no model: pass --model-dir or set MODEL_DIR.", file=sys.stderr)
        return 2
    args.model_dir = str(resolve(args.model_dir))
    served_name = args.served_name or Path(args.model_dir).name or "model"
    default_max = max(1, min(args.max_new_tokens, MAX_TOKENS_CAP))

    engine = Engine(args.model_dir, served_name, max(1.0, args.max_seconds), args.trust_remote_code)
    try:
        server = AppServer((args.host, args.port), engine, api_key, jupyter_token, default_max)
    except OSError as exc:
        print(f"llm-chat: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    log(f"listening on http://{args.host}:{args.port}/ (model {served_name} from {args.model_dir})")
    engine.load_in_background()

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()
        log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
