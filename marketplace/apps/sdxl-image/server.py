"""文生图 (text to image): a web page and an OpenAI-compatible images API over a diffusers pipeline.

The console starts this inside an instance (``sh -c`` with the manifest's command):

    python server.py --host ${GPC_BIND_ADDRESS:-127.0.0.1} --port 7860 [--model-dir DIR]

``DIR`` (default: env ``MODEL_DIR``) is a diffusers pipeline saved with ``save_pretrained``
(Stable Diffusion XL base in the catalogue; any ``DiffusionPipeline`` that takes a prompt loads).
The console's port proxy serves the port under ``/instances/<id>/ports/<port>/`` and strips that
prefix, so every URL in the page is relative.

Endpoints (all but ``GET /healthz`` need ``Authorization: Bearer $GPC_APP_API_KEY`` or the
console proxy's ``Authorization: token $JUPYTER_TOKEN``):

- ``GET /healthz``: 503 while the pipeline loads (in a background thread, after the socket is
  bound, so the console sees the app come up), 200 when ready, 500 with the reason if loading failed.
- ``GET /``: the page (Chinese, or English when ``Accept-Language`` starts with ``en``).
- ``POST /v1/images/generations``: OpenAI's images API (``prompt``, ``n``, ``size``,
  ``response_format: b64_json``) plus ``negative_prompt``, ``steps``, ``guidance_scale``, ``seed``;
  it answers when the images are made.
- ``POST /v1/jobs`` and ``GET /v1/jobs/<id>``: the same request queued, and its progress step by
  step (what the page polls to drive its progress bar).
- ``GET /v1/images``: the most recent images; ``GET /images/<name>``: one PNG.
- ``GET /v1/models``: the loaded model, OpenAI's list shape, named ``--served-name`` (env
  ``APP_MODEL_NAME``, else the directory name).

One pipeline call runs at a time (a single worker thread takes jobs from a bounded queue): a GPU
holds one SDXL generation comfortably, two would compete for memory. Every image is saved as PNG
under ``${PFS:-/pfs}/outputs/sdxl-image/`` with the prompt, seed and settings in its text chunks,
so a picture can be reproduced from the file alone.
"""

from __future__ import annotations

import argparse
import base64
import hmac
import inspect
import io
import json
import logging
import os
import queue
import re
import secrets
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

log = logging.getLogger("sdxl-image")

APP_SLUG = "sdxl-image"
MAX_BODY = 1024 * 1024  # a prompt is a few hundred bytes; 1 MB is generous and still bounded
MAX_PROMPT_CHARS = 4000
MIN_SIDE, MAX_SIDE, SIDE_STEP = 64, 1536, 8  # the VAE scales by 8; 1536 is SDXL's sensible top
MAX_STEPS = 50
DEFAULT_STEPS = 30
MAX_IMAGES = 4
MAX_GUIDANCE = 20.0
MAX_SEED = 2**32 - 1
MAX_QUEUE = 8  # waiting jobs; beyond that a request is refused with 429, not left to time out
JOB_HISTORY = 64  # finished jobs kept for polling
RECENT_LIMIT = 24
# Width/height choices the page offers (the pipeline's own default size is added to them).
SIZE_CHOICES = (512, 640, 768, 832, 896, 1024, 1152, 1216, 1344, 1536)
SIZE_RE = re.compile(r"^(\d{1,5})x(\d{1,5})$")
IMAGE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,150}\.png$")
JOB_ID_RE = re.compile(r"^[0-9a-f]{32}$")
# Requests polled several times a second; logging each would drown the instance log.
QUIET_PATHS = re.compile(r"^/(healthz|v1/jobs/[0-9a-f]+|v1/images|images/[^/]+)$")


class ApiError(Exception):
    """An OpenAI-style error: the status and the ``{"error": {...}}`` body a client can show."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": code}}


# ----------------------------------------------------------------------------------------------
# Requests


@dataclass(frozen=True)
class Params:
    """A checked generation request. ``width``/``height`` None: the pipeline's default size."""

    prompt: str
    negative_prompt: str
    n: int
    width: int | None
    height: int | None
    steps: int
    guidance_scale: float | None  # None: the pipeline's own default
    seed: int | None  # None: a random one, reported back


def _int_field(body: dict[str, Any], name: str, low: int, high: int, default: int) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    # JSON true is an int in Python; a float like 2.0 is accepted only when whole.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, f"'{name}' must be an integer", param=name)
    if isinstance(value, float) and not value.is_integer():
        raise ApiError(400, f"'{name}' must be an integer", param=name)
    if not low <= value <= high:
        raise ApiError(400, f"'{name}' must be between {low} and {high}", param=name)
    return int(value)


def _text_field(body: dict[str, Any], name: str, *, required: bool) -> str:
    value = body.get(name)
    if value is None and required:
        raise ApiError(400, f"'{name}' is required", param=name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ApiError(400, f"'{name}' must be a string", param=name)
    if required and not value.strip():
        raise ApiError(400, f"'{name}' must not be empty", param=name)
    if len(value) > MAX_PROMPT_CHARS:
        raise ApiError(400, f"'{name}' is longer than {MAX_PROMPT_CHARS} characters", param=name)
    return value


def parse_size(value: Any) -> tuple[int | None, int | None]:
    """``"WxH"`` with both sides multiples of 8 within bounds; missing or ``"auto"``: default."""
    if value is None or value == "auto":
        return None, None
    match = SIZE_RE.match(value) if isinstance(value, str) else None
    if not match:
        raise ApiError(400, "'size' must look like '1024x1024' (width x height)", param="size")
    width, height = int(match.group(1)), int(match.group(2))
    for side in (width, height):
        if not MIN_SIDE <= side <= MAX_SIDE or side % SIDE_STEP:
            raise ApiError(
                400,
                f"'size' sides must be multiples of {SIDE_STEP} between {MIN_SIDE} and {MAX_SIDE}",
                param="size",
            )
    return width, height


def parse_params(body: Any) -> Params:
    """Check a request body; every field is bounded so one request cannot hold the GPU for hours."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    fmt = body.get("response_format")
    if fmt not in (None, "b64_json"):
        raise ApiError(400, "only response_format 'b64_json' is supported", param="response_format")
    width, height = parse_size(body.get("size"))
    steps_name = "steps" if "steps" in body else "num_inference_steps"
    guidance = body.get("guidance_scale")
    if guidance is not None:
        if isinstance(guidance, bool) or not isinstance(guidance, int | float):
            raise ApiError(400, "'guidance_scale' must be a number", param="guidance_scale")
        if not 0.0 <= guidance <= MAX_GUIDANCE:
            raise ApiError(
                400,
                f"'guidance_scale' must be between 0 and {MAX_GUIDANCE:g}",
                param="guidance_scale",
            )
        guidance = float(guidance)
    seed = body.get("seed")
    if seed is not None:
        seed = _int_field(body, "seed", 0, MAX_SEED, 0)
    return Params(
        prompt=_text_field(body, "prompt", required=True),
        negative_prompt=_text_field(body, "negative_prompt", required=False),
        n=_int_field(body, "n", 1, MAX_IMAGES, 1),
        width=width,
        height=height,
        steps=_int_field(body, steps_name, 1, MAX_STEPS, DEFAULT_STEPS),
        guidance_scale=guidance,
        seed=seed,
    )


# ----------------------------------------------------------------------------------------------
# Jobs and the pipeline


@dataclass
class SavedImage:
    name: str
    seed: int
    width: int
    height: int
    png: bytes | None = None  # kept only until the API request that asked for it answers


@dataclass
class Job:
    params: Params
    keep_png: bool  # the synchronous API returns the bytes; the page fetches the saved files
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: float = field(default_factory=time.time)
    status: str = "queued"  # queued, running, decoding, done, error
    started: float | None = None
    finished: float | None = None
    step: int = 0
    total_steps: int = 0
    seed: int | None = None
    width: int | None = None
    height: int | None = None
    images: list[SavedImage] = field(default_factory=list)
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


def resolve(path: str) -> Path:
    """A path as the container sees it (/models/..., /pfs/...). On a bare host (the console's
    ``runtime=process``) the instance's directory, the working directory, stands in for the
    container's root: the mounts and /pfs are links there."""
    p = Path(path)
    if not path or p.exists() or not p.is_absolute():
        return p
    inside = Path.cwd() / path.lstrip("/")
    return inside if inside.exists() else p


def default_output_dir() -> Path:
    return resolve(os.environ.get("PFS") or "/pfs") / "outputs" / APP_SLUG


def usable_output_dir(wanted: Path) -> Path:
    """The outputs folder, created; a temporary one (logged loudly) when it cannot be written, so
    the page still works on a host without the shared file system."""
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        probe = wanted / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return wanted
    except OSError as exc:
        fallback = Path(tempfile.mkdtemp(prefix=f"{APP_SLUG}-"))
        log.warning("cannot write to %s (%s); saving images to %s instead", wanted, exc, fallback)
        return fallback


class Engine:
    """Loads the pipeline, then runs queued jobs one at a time on a single worker thread."""

    def __init__(self, model_dir: Path, output_dir: Path, served_name: str = "") -> None:
        self.model_dir = model_dir
        self.served_name = served_name
        self.output_dir = output_dir
        self.state = "loading"  # loading, ok, error
        self.error: str | None = None
        self.load_started = time.time()
        self.pipe: Any = None
        self.device = "cpu"
        self.dtype = "float32"
        self.pipeline_class = ""
        self.default_width = 1024
        self.default_height = 1024
        self.default_guidance: float = 7.0
        self.call_params: set[str] = set()
        self.queue: queue.Queue[Job] = queue.Queue(maxsize=MAX_QUEUE)
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self.lock = threading.Lock()
        self.recent_cache: dict[tuple[str, float], dict[str, Any]] = {}

    @property
    def model_name(self) -> str:
        return self.served_name or self.model_dir.name or str(self.model_dir)

    def start(self) -> None:
        threading.Thread(target=self._run, name="pipeline", daemon=True).start()

    # -- loading -------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._load()
        except Exception as exc:  # noqa: BLE001 - any failure is reported by /healthz
            self.error = f"{type(exc).__name__}: {exc}"[:2000]
            self.state = "error"
            log.exception("loading the pipeline from %s failed", self.model_dir)
            return
        self.state = "ok"
        log.info(
            "ready: %s (%s) on %s %s, default size %dx%d, loaded in %.1f s",
            self.model_name,
            self.pipeline_class,
            self.device,
            self.dtype,
            self.default_width,
            self.default_height,
            time.time() - self.load_started,
        )
        while True:
            job = self.queue.get()
            self._generate(job)

    def _load(self) -> None:
        log.info("loading the pipeline from %s", self.model_dir)
        if not (self.model_dir / "model_index.json").is_file():
            raise FileNotFoundError(
                f"{self.model_dir} has no model_index.json (not a diffusers pipeline)"
            )
        import diffusers
        import torch
        import transformers

        # Progress bars are carriage-return art in a log file.
        diffusers.utils.logging.disable_progress_bar()
        transformers.utils.logging.disable_progress_bar()
        cuda = torch.cuda.is_available()
        dtype = torch.float16 if cuda else torch.float32
        # Newer diffusers name the argument ``dtype`` and warn about ``torch_dtype``; older ones
        # know only ``torch_dtype``.
        resolves = hasattr(getattr(diffusers.utils, "deprecation_utils", None), "_resolve_dtype")
        options: dict[str, Any] = {
            "dtype" if resolves else "torch_dtype": dtype,
            "local_files_only": True,
        }
        try:
            pipe = diffusers.DiffusionPipeline.from_pretrained(str(self.model_dir), **options)
        except (OSError, ValueError):
            # A snapshot with only the half-precision weights names them *.fp16.*.
            if not any(".fp16." in p.name for p in self.model_dir.rglob("*")):
                raise
            pipe = diffusers.DiffusionPipeline.from_pretrained(
                str(self.model_dir), variant="fp16", **options
            )
        if cuda:
            pipe = pipe.to("cuda")
        pipe.set_progress_bar_config(disable=True)
        vae = getattr(pipe, "vae", None)
        if vae is not None and hasattr(vae, "enable_slicing"):
            # Decode a batch one image at a time: four 1024x1024 SDXL decodes at once peak at
            # several GB more than one does, for no speed gain worth having.
            vae.enable_slicing()
        self.pipe = pipe
        self.device = "cuda" if cuda else "cpu"
        self.dtype = str(dtype).removeprefix("torch.")
        self.pipeline_class = type(pipe).__name__
        signature = inspect.signature(pipe.__call__).parameters
        self.call_params = set(signature)
        guidance = signature.get("guidance_scale")
        if guidance is not None and isinstance(guidance.default, int | float):
            self.default_guidance = float(guidance.default)
        side = self._default_side(pipe)
        if side:
            self.default_width = self.default_height = side

    @staticmethod
    def _default_side(pipe: Any) -> int | None:
        """The size the model was trained at: SDXL 1024, SD 1.5 512 (latent size x VAE scale)."""
        unet = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
        sample = getattr(getattr(unet, "config", None), "sample_size", None)
        scale = getattr(pipe, "vae_scale_factor", None) or 8
        if isinstance(sample, list | tuple):
            sample = sample[0]
        if not isinstance(sample, int):
            return None
        side = sample * int(scale)
        return max(MIN_SIDE, min(MAX_SIDE, side - side % SIDE_STEP))

    # -- jobs ----------------------------------------------------------------------------------

    def submit(self, params: Params, *, keep_png: bool) -> Job:
        if self.state == "loading":
            raise ApiError(
                503,
                "the model is still loading; try again shortly",
                code="model_loading",
                kind="server_error",
            )
        if self.state == "error":
            raise ApiError(
                500,
                f"the model failed to load: {self.error}",
                code="model_error",
                kind="server_error",
            )
        job = Job(params=params, keep_png=keep_png)
        with self.lock:
            try:
                self.queue.put_nowait(job)
            except queue.Full:
                raise ApiError(
                    429,
                    f"{MAX_QUEUE} generations are already waiting; try again later",
                    code="queue_full",
                    kind="rate_limit_error",
                ) from None
            self.jobs[job.id] = job
            self._prune()
        log.info(
            "job %s queued: %d image(s), %s, %d steps, prompt of %d characters",
            job.id[:8],
            params.n,
            f"{params.width}x{params.height}" if params.width else "default size",
            params.steps,
            len(params.prompt),
        )
        return job

    def _prune(self) -> None:
        finished = [k for k, j in self.jobs.items() if j.done.is_set()]
        for key in finished[: max(0, len(self.jobs) - JOB_HISTORY)]:
            del self.jobs[key]

    def job(self, job_id: str) -> Job | None:
        with self.lock:
            return self.jobs.get(job_id)

    def position(self, job: Job) -> int:
        """How many jobs run or wait before this one."""
        with self.lock:
            ahead = 0
            for other in self.jobs.values():
                if other is job:
                    return ahead
                if other.status in ("queued", "running", "decoding"):
                    ahead += 1
            return ahead

    def pending(self) -> int:
        with self.lock:
            return sum(1 for j in self.jobs.values() if not j.done.is_set())

    def _generate(self, job: Job) -> None:
        import torch

        params = job.params
        job.status = "running"
        job.started = time.time()
        job.width = params.width or self.default_width
        job.height = params.height or self.default_height
        job.seed = params.seed if params.seed is not None else secrets.randbelow(MAX_SEED + 1)
        job.total_steps = params.steps
        seeds = [(job.seed + i) % (MAX_SEED + 1) for i in range(params.n)]
        try:
            # One CPU generator per image: image i is reproducible alone with seed + i, on any
            # device (CPU noise is the same everywhere; CUDA noise differs between GPU models).
            generators = [torch.Generator(device="cpu").manual_seed(s) for s in seeds]
            kwargs: dict[str, Any] = {
                "prompt": params.prompt,
                "negative_prompt": params.negative_prompt or None,
                "num_inference_steps": params.steps,
                "guidance_scale": (
                    params.guidance_scale
                    if params.guidance_scale is not None
                    else self.default_guidance
                ),
                "width": job.width,
                "height": job.height,
                "num_images_per_prompt": params.n,
                "generator": generators,
            }
            if "callback_on_step_end" in self.call_params:
                kwargs["callback_on_step_end"] = self._progress_callback(job)
            # Pipelines differ (FLUX has no negative prompt): pass only what this one takes.
            kwargs = {k: v for k, v in kwargs.items() if k in self.call_params and v is not None}
            with torch.inference_mode():
                result = self.pipe(**kwargs)
            images = list(result.images)[: params.n]
            job.status = "decoding"
            job.images = [
                self._save(job, image, seed, index)
                for index, (image, seed) in enumerate(zip(images, seeds, strict=False))
            ]
            job.status = "done"
        except Exception as exc:  # noqa: BLE001 - the job reports it; the worker goes on
            job.error = f"{type(exc).__name__}: {exc}"[:1000]
            job.status = "error"
            log.exception("job %s failed", job.id[:8])
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # after an out-of-memory error, free what it held
        finally:
            job.finished = time.time()
            job.done.set()
        if job.status == "done":
            log.info(
                "job %s done: %d image(s) %dx%d, seed %d, %.1f s",
                job.id[:8],
                len(job.images),
                job.width,
                job.height,
                job.seed,
                job.finished - (job.started or job.finished),
            )

    @staticmethod
    def _progress_callback(job: Job) -> Any:
        def on_step_end(
            pipe: Any, index: int, timestep: Any, tensors: dict[str, Any]
        ) -> dict[str, Any]:
            # Second-order schedulers run more than one UNet call per step: count what it does.
            timesteps = getattr(getattr(pipe, "scheduler", None), "timesteps", None)
            total = len(timesteps) if timesteps is not None else job.params.steps
            job.total_steps = max(total, 1)
            job.step = min(index + 1, job.total_steps)
            if job.step == job.total_steps:
                job.status = "decoding"  # the VAE decode and the PNG encoding come next
            return tensors

        return on_step_end

    def _save(self, job: Job, image: Any, seed: int, index: int) -> SavedImage:
        """PNG with the prompt, seed and settings as text chunks, written atomically."""
        from PIL.PngImagePlugin import PngInfo

        params = job.params
        guidance = (
            params.guidance_scale if params.guidance_scale is not None else self.default_guidance
        )
        info = PngInfo()
        info.add_text("prompt", params.prompt)  # iTXt (UTF-8) when the text is not Latin-1
        if params.negative_prompt:
            info.add_text("negative_prompt", params.negative_prompt)
        info.add_text("seed", str(seed))
        info.add_text("steps", str(params.steps))
        info.add_text("guidance_scale", f"{guidance:g}")
        info.add_text("size", f"{image.width}x{image.height}")
        info.add_text("model", self.model_name)
        info.add_text("pipeline", self.pipeline_class)
        # The one-line summary other Stable Diffusion tools read.
        info.add_text(
            "parameters",
            f"{params.prompt}\nNegative prompt: {params.negative_prompt}\n"
            f"Steps: {params.steps}, CFG scale: {guidance:g}, Seed: {seed}, "
            f"Size: {image.width}x{image.height}, Model: {self.model_name}",
        )
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", pnginfo=info)
        data = buffer.getvalue()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(job.created))
        name = f"{stamp}-{job.id[:8]}-{index}.png"
        path = self.output_dir / name
        partial = path.with_name(f".{name}.part")
        partial.write_bytes(data)
        os.replace(partial, path)
        return SavedImage(
            name=name,
            seed=seed,
            width=image.width,
            height=image.height,
            png=data if job.keep_png else None,
        )

    # -- saved images --------------------------------------------------------------------------

    def image_path(self, name: str) -> Path | None:
        if not IMAGE_NAME_RE.match(name):
            return None
        path = self.output_dir / name
        return path if path.is_file() else None

    def recent(self, limit: int) -> list[dict[str, Any]]:
        """The newest PNGs of the outputs folder, with the prompt and seed read from each file."""
        try:
            entries = [
                (p.stat().st_mtime, p)
                for p in self.output_dir.iterdir()
                if IMAGE_NAME_RE.match(p.name) and p.is_file()
            ]
        except OSError:
            return []
        entries.sort(key=lambda e: e[0], reverse=True)
        out = []
        for mtime, path in entries[:limit]:
            key = (path.name, mtime)
            meta = self.recent_cache.get(key)
            if meta is None:
                meta = read_png_meta(path)
                if len(self.recent_cache) > 4 * RECENT_LIMIT:
                    self.recent_cache.clear()
                self.recent_cache[key] = meta
            out.append(
                {"name": path.name, "url": f"images/{path.name}", "created": int(mtime), **meta}
            )
        return out


def read_png_meta(path: Path) -> dict[str, Any]:
    try:
        from PIL import Image

        with Image.open(path) as image:
            text = dict(getattr(image, "text", {}) or {})
            width, height = image.size
    except Exception:  # noqa: BLE001 - a foreign or broken file is listed without details
        return {}
    seed = text.get("seed", "")
    return {
        "prompt": text.get("prompt", ""),
        "seed": int(seed) if seed.isdigit() else None,
        "width": width,
        "height": height,
    }


def job_view(engine: Engine, job: Job) -> dict[str, Any]:
    total = job.total_steps or job.params.steps
    progress = {"queued": 0.0, "done": 1.0}.get(job.status, job.step / total if total else 0.0)
    return {
        "id": job.id,
        "status": job.status,
        "position": engine.position(job) if job.status == "queued" else 0,
        "step": job.step,
        "total_steps": total,
        "progress": round(progress, 4),
        "elapsed_s": (
            round((job.finished or time.time()) - job.started, 1) if job.started else 0.0
        ),
        "seed": job.seed,
        "width": job.width,
        "height": job.height,
        "n": job.params.n,
        "images": [
            {
                "name": i.name,
                "url": f"images/{i.name}",
                "seed": i.seed,
                "width": i.width,
                "height": i.height,
            }
            for i in job.images
        ],
        "error": job.error,
    }


# ----------------------------------------------------------------------------------------------
# The page

LABELS = {
    "zh": {
        "title": "文生图",
        "prompt": "提示词",
        "prompt_hint": "描述你想要的画面，例如：雪山下的湖泊，清晨的薄雾，油画风格",
        "negative": "反向提示词（可选）",
        "negative_hint": "不想出现的内容，例如：模糊，低质量，文字",
        "steps": "采样步数",
        "guidance": "提示词引导强度（CFG）",
        "width": "宽度",
        "height": "高度",
        "count": "张数",
        "seed": "随机种子（留空则随机）",
        "generate": "生成",
        "loading": "模型加载中，请稍候…",
        "load_failed": "模型加载失败：",
        "ready": "模型已就绪：{model}（{device}）",
        "queued": "排队中，前面还有 {n} 个任务",
        "running": "生成中：第 {step}/{total} 步",
        "decoding": "正在解码并保存图片…",
        "done": "完成，用时 {s} 秒",
        "error": "出错了：",
        "recent": "最近生成",
        "no_recent": "还没有图片",
        "seed_label": "种子",
        "saved": "图片保存在 outputs/sdxl-image/ 目录",
        "need_prompt": "请先输入提示词",
        "shortcut": "Ctrl+Enter 生成",
    },
    "en": {
        "title": "Text to image",
        "prompt": "Prompt",
        "prompt_hint": "Describe the picture, e.g. a lake below snowy mountains, morning mist, oil painting",
        "negative": "Negative prompt (optional)",
        "negative_hint": "What to avoid, e.g. blurry, low quality, text",
        "steps": "Steps",
        "guidance": "Guidance scale (CFG)",
        "width": "Width",
        "height": "Height",
        "count": "Images",
        "seed": "Seed (empty: random)",
        "generate": "Generate",
        "loading": "Loading the model, please wait…",
        "load_failed": "The model failed to load: ",
        "ready": "Model ready: {model} ({device})",
        "queued": "Queued: {n} job(s) ahead",
        "running": "Generating: step {step} of {total}",
        "decoding": "Decoding and saving the images…",
        "done": "Done in {s} s",
        "error": "Error: ",
        "recent": "Recent images",
        "no_recent": "No images yet",
        "seed_label": "Seed",
        "saved": "Images are saved in the outputs/sdxl-image/ folder",
        "need_prompt": "Please enter a prompt first",
        "shortcut": "Ctrl+Enter generates",
    },
}

PAGE = """<!DOCTYPE html>
<html lang="__LANG__">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
*{box-sizing:border-box}
body{margin:0;font:14px/1.5 system-ui,-apple-system,"PingFang SC","Microsoft YaHei",sans-serif;
  background:#f4f6f9;color:#1f2933}
header{padding:12px 20px;background:#1f2933;color:#fff;display:flex;gap:16px;align-items:baseline}
header h1{font-size:18px;margin:0}
#model{font-size:13px;opacity:.8}
main{display:grid;grid-template-columns:minmax(280px,380px) 1fr;gap:16px;padding:16px 20px}
@media (max-width:800px){main{grid-template-columns:1fr}}
section{background:#fff;border-radius:8px;padding:16px;box-shadow:0 1px 3px rgba(0,0,0,.08)}
label{display:block;font-weight:600;margin:10px 0 4px}
textarea,input,select{width:100%;padding:7px 9px;border:1px solid #c5ced8;border-radius:6px;font:inherit}
textarea{resize:vertical}
.row{display:grid;grid-template-columns:1fr 1fr;gap:10px}
.value{float:right;font-weight:400;color:#52606d}
input[type=range]{padding:0}
button{margin-top:14px;width:100%;padding:10px;border:0;border-radius:6px;background:#2563eb;
  color:#fff;font-size:15px;font-weight:600;cursor:pointer}
button:disabled{background:#9aa5b1;cursor:not-allowed}
.hint{color:#7b8794;font-size:12px;margin-top:6px}
#bar{height:10px;background:#e4e7eb;border-radius:5px;overflow:hidden;margin:4px 0 8px}
#bar div{height:100%;width:0;background:#2563eb;transition:width .2s}
#status{min-height:21px;color:#52606d}
#status.err{color:#c81e1e}
#result{display:flex;flex-wrap:wrap;gap:12px;margin-top:8px}
#result figure{margin:0;max-width:100%}
#result img{max-width:100%;max-height:70vh;border-radius:6px;display:block;background:#e4e7eb}
figcaption{font-size:12px;color:#52606d}
#recent{display:grid;grid-template-columns:repeat(auto-fill,minmax(120px,1fr));gap:8px;margin-top:8px}
#recent img{width:100%;aspect-ratio:1;object-fit:cover;border-radius:4px;cursor:pointer;background:#e4e7eb}
h2{font-size:15px;margin:0 0 6px}
</style>
</head>
<body>
<header><h1>__TITLE__</h1><span id="model"></span></header>
<main>
<section>
<form id="form" autocomplete="off">
<label for="prompt">__PROMPT__</label>
<textarea id="prompt" rows="4" maxlength="__MAXCHARS__" placeholder="__PROMPT_HINT__"></textarea>
<label for="negative">__NEGATIVE__</label>
<textarea id="negative" rows="2" maxlength="__MAXCHARS__" placeholder="__NEGATIVE_HINT__"></textarea>
<label for="steps">__STEPS__ <span class="value" id="steps-value"></span></label>
<input id="steps" type="range" min="1" max="__MAXSTEPS__" value="__DEFSTEPS__">
<label for="guidance">__GUIDANCE__ <span class="value" id="guidance-value"></span></label>
<input id="guidance" type="range" min="0" max="__MAXGUIDANCE__" step="0.5" value="7">
<div class="row">
<div><label for="width">__WIDTH__</label><select id="width"></select></div>
<div><label for="height">__HEIGHT__</label><select id="height"></select></div>
</div>
<div class="row">
<div><label for="count">__COUNT__</label><select id="count"></select></div>
<div><label for="seed">__SEED__</label><input id="seed" type="number" min="0" max="__MAXSEED__" step="1"></div>
</div>
<button id="generate" type="submit" disabled>__GENERATE__</button>
<div class="hint">__SHORTCUT__ · __SAVED__</div>
</form>
</section>
<section>
<div id="bar"><div></div></div>
<div id="status"></div>
<div id="result"></div>
</section>
<section style="grid-column:1/-1">
<h2>__RECENT__</h2>
<div id="recent"></div>
</section>
</main>
<script>
"use strict";
const L = __LABELS_JSON__;
const CFG = __CONFIG_JSON__;
const $ = (id) => document.getElementById(id);
let ready = false, busy = false;

function fmt(text, values) {
  return text.replace(/\\{(\\w+)\\}/g, (m, k) => (k in values ? String(values[k]) : m));
}
function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "err" : "";
}
function setBar(fraction) {
  $("bar").firstElementChild.style.width = Math.round(Math.max(0, Math.min(1, fraction)) * 100) + "%";
}
function fillSelect(select, values, chosen) {
  select.textContent = "";
  for (const v of values) {
    const o = document.createElement("option");
    o.value = String(v); o.textContent = String(v);
    if (v === chosen) o.selected = true;
    select.appendChild(o);
  }
}
function sides(extra) {
  const s = new Set(CFG.sizes); s.add(extra);
  return Array.from(s).sort((a, b) => a - b);
}
async function api(path, options) {
  const response = await fetch(path, Object.assign({credentials: "same-origin"}, options || {}));
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const message = body && body.error ? (body.error.message || body.error) : response.status + " " + response.statusText;
    throw new Error(String(message));
  }
  return body;
}
function showSlider(id) { $(id + "-value").textContent = $(id).value; }

async function waitReady() {
  let health = null, status = 0;
  try {
    const r = await fetch("healthz", {cache: "no-store"});
    status = r.status; health = await r.json();
  } catch (e) { health = null; }
  if (status === 200 && health) {
    ready = true;
    $("model").textContent = fmt(L.ready, {model: health.model, device: health.device});
    const [w, h] = String(health.default_size || "1024x1024").split("x").map(Number);
    fillSelect($("width"), sides(w), w);
    fillSelect($("height"), sides(h), h);
    if (typeof health.default_guidance === "number") {
      $("guidance").value = String(health.default_guidance); showSlider("guidance");
    }
    setStatus("");
    $("generate").disabled = busy;
    return;
  }
  if (status === 500 && health) { setStatus(L.load_failed + (health.error || ""), true); return; }
  setStatus(L.loading);
  setTimeout(waitReady, 2000);
}

function figure(image, prompt) {
  const fig = document.createElement("figure");
  const link = document.createElement("a");
  link.href = image.url; link.target = "_blank"; link.rel = "noopener";
  const img = document.createElement("img");
  img.src = image.url; img.alt = prompt || "";
  if (image.width) { img.width = image.width; img.height = image.height; }
  link.appendChild(img); fig.appendChild(link);
  const cap = document.createElement("figcaption");
  cap.textContent = L.seed_label + ": " + (image.seed === null || image.seed === undefined ? "-" : image.seed)
    + (image.width ? "  " + image.width + "\\u00d7" + image.height : "");
  fig.appendChild(cap);
  return fig;
}
function showImages(images, prompt) {
  const box = $("result"); box.textContent = "";
  for (const image of images) box.appendChild(figure(image, prompt));
}

async function loadRecent() {
  let body;
  try { body = await api("v1/images?limit=" + CFG.recent); } catch (e) { return; }
  const box = $("recent"); box.textContent = "";
  if (!body.data.length) {
    const p = document.createElement("div"); p.className = "hint"; p.textContent = L.no_recent;
    box.appendChild(p); return;
  }
  for (const item of body.data) {
    const img = document.createElement("img");
    img.src = item.url; img.loading = "lazy"; img.alt = item.prompt || item.name;
    img.title = (item.prompt || "") + (item.seed !== null && item.seed !== undefined ? "\\n" + L.seed_label + ": " + item.seed : "");
    img.addEventListener("click", () => {
      showImages([item], item.prompt);
      if (item.prompt) $("prompt").value = item.prompt;
      if (item.seed !== null && item.seed !== undefined) $("seed").value = String(item.seed);
    });
    box.appendChild(img);
  }
}

function sleep(ms) { return new Promise((resolve) => setTimeout(resolve, ms)); }

async function follow(id, prompt) {
  for (;;) {
    const job = await api("v1/jobs/" + encodeURIComponent(id), {cache: "no-store"});
    if (job.status === "queued") { setStatus(fmt(L.queued, {n: job.position})); setBar(0); }
    else if (job.status === "running") {
      setStatus(fmt(L.running, {step: job.step, total: job.total_steps})); setBar(job.progress);
    } else if (job.status === "decoding") { setStatus(L.decoding); setBar(1); }
    else if (job.status === "done") {
      setBar(1); setStatus(fmt(L.done, {s: job.elapsed_s}));
      showImages(job.images, prompt); return;
    } else { throw new Error(job.error || job.status); }
    await sleep(400);
  }
}

async function generate(event) {
  if (event) event.preventDefault();
  if (!ready || busy) return;
  const prompt = $("prompt").value;
  if (!prompt.trim()) { setStatus(L.need_prompt, true); $("prompt").focus(); return; }
  const body = {
    prompt: prompt,
    negative_prompt: $("negative").value,
    steps: Number($("steps").value),
    guidance_scale: Number($("guidance").value),
    size: $("width").value + "x" + $("height").value,
    n: Number($("count").value),
  };
  if ($("seed").value.trim() !== "") body.seed = Number($("seed").value);
  busy = true; $("generate").disabled = true; setBar(0); setStatus("");
  try {
    const job = await api("v1/jobs", {
      method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
    });
    await follow(job.id, prompt);
    loadRecent();
  } catch (e) {
    setStatus(L.error + e.message, true);
  } finally {
    busy = false; $("generate").disabled = !ready;
  }
}

fillSelect($("count"), Array.from({length: CFG.max_images}, (_, i) => i + 1), 1);
fillSelect($("width"), sides(1024), 1024);
fillSelect($("height"), sides(1024), 1024);
for (const id of ["steps", "guidance"]) {
  showSlider(id); $(id).addEventListener("input", () => showSlider(id));
}
$("form").addEventListener("submit", generate);
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) generate(e);
});
waitReady();
loadRecent();
</script>
</body>
</html>
"""


def page_language(accept_language: str | None) -> str:
    return "en" if (accept_language or "").strip().lower().startswith("en") else "zh"


def _script_json(value: Any) -> str:
    """JSON safe inside a <script> element (no ``</script>`` can close it early)."""
    return json.dumps(value, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e")


def render_page(language: str) -> str:
    labels = LABELS[language]
    config = {
        "sizes": list(SIZE_CHOICES),
        "max_images": MAX_IMAGES,
        "recent": RECENT_LIMIT,
    }
    # Placeholders are plain markers replaced once; the labels are ours, never user text.
    replacements = {
        "__LANG__": "zh-CN" if language == "zh" else "en",
        "__TITLE__": labels["title"],
        "__PROMPT_HINT__": labels["prompt_hint"],
        "__PROMPT__": labels["prompt"],
        "__NEGATIVE_HINT__": labels["negative_hint"],
        "__NEGATIVE__": labels["negative"],
        "__STEPS__": labels["steps"],
        "__GUIDANCE__": labels["guidance"],
        "__WIDTH__": labels["width"],
        "__HEIGHT__": labels["height"],
        "__COUNT__": labels["count"],
        "__SEED__": labels["seed"],
        "__GENERATE__": labels["generate"],
        "__SHORTCUT__": labels["shortcut"],
        "__SAVED__": labels["saved"],
        "__RECENT__": labels["recent"],
        "__MAXCHARS__": str(MAX_PROMPT_CHARS),
        "__MAXSTEPS__": str(MAX_STEPS),
        "__DEFSTEPS__": str(DEFAULT_STEPS),
        "__MAXGUIDANCE__": f"{MAX_GUIDANCE:g}",
        "__MAXSEED__": str(MAX_SEED),
        "__LABELS_JSON__": _script_json(labels),
        "__CONFIG_JSON__": _script_json(config),
    }
    html = PAGE
    for marker, text in replacements.items():
        html = html.replace(marker, text)
    return html


# ----------------------------------------------------------------------------------------------
# HTTP


class Handler(BaseHTTPRequestHandler):
    """The routes; ``engine`` and ``credentials`` are set on the subclass ``make_handler`` builds."""

    # Every small write (headers, each streamed chunk) goes out at once: Nagle's algorithm
    # would hold it for the client's delayed acknowledgement (~40 ms on a kept-alive connection).
    disable_nagle_algorithm = True

    protocol_version = "HTTP/1.1"
    server_version = "gpc-sdxl-image/1"
    engine: Engine
    credentials: tuple[tuple[str, str], ...]  # (scheme, secret): ("bearer", key), ("token", tok)

    # -- plumbing ------------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        log.info("%s %s", self.address_string(), format % args)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        path = urlsplit(self.path).path
        if path == "/healthz" or (QUIET_PATHS.match(path) and str(code).startswith("2")):
            return
        log.info('%s "%s %s" %s', self.address_string(), self.command, path, code)

    def _send(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, value: Any, headers: dict[str, str] | None = None) -> None:
        payload = json.dumps(value, ensure_ascii=False).encode("utf-8")
        merged = {"Cache-Control": "no-store", **(headers or {})}
        self._send(status, payload, "application/json; charset=utf-8", merged)

    def _error(self, error: ApiError) -> None:
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        if error.status == 429:
            headers = {"Retry-After": "10"}
        self._json(error.status, error.body, headers)

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        scheme, _, given = header.strip().partition(" ")
        given = given.strip().encode("utf-8")
        ok = False
        for wanted_scheme, secret in self.credentials:
            # Every configured secret is compared, so timing says nothing about which matched.
            match = hmac.compare_digest(given, secret.encode("utf-8"))
            ok = ok or (match and scheme.lower() == wanted_scheme)
        return ok

    def _require_auth(self) -> bool:
        if self._authorized():
            return True
        if self.command == "POST":
            self.close_connection = True  # the unread body must not be parsed as a request
        self._error(
            ApiError(
                401,
                "missing or invalid API key: send 'Authorization: Bearer <API key>'",
                code="invalid_api_key",
            )
        )
        return False

    def _read_json(self) -> Any:
        if self.headers.get("Transfer-Encoding", "").lower() not in ("", "identity"):
            self.close_connection = True
            raise ApiError(411, "send the body with a Content-Length")
        raw_length = self.headers.get("Content-Length", "0") or "0"
        try:
            length = int(raw_length)
        except ValueError:
            self.close_connection = True
            raise ApiError(400, "invalid Content-Length") from None
        if length < 0:
            self.close_connection = True
            raise ApiError(400, "invalid Content-Length")
        if length > MAX_BODY:
            self.close_connection = True
            raise ApiError(413, f"the request body is larger than {MAX_BODY} bytes")
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}") from None

    # -- routes --------------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        url = urlsplit(self.path)
        path = url.path
        try:
            if path == "/healthz":
                self._health()
                return
            if not self._require_auth():
                return
            if path in ("/", "/index.html"):
                html = render_page(page_language(self.headers.get("Accept-Language")))
                self._send(
                    200,
                    html.encode("utf-8"),
                    "text/html; charset=utf-8",
                    {
                        "Cache-Control": "no-store",
                        "Content-Security-Policy": (
                            "default-src 'self'; img-src 'self' data: blob:; "
                            "style-src 'unsafe-inline'; script-src 'unsafe-inline'"
                        ),
                    },
                )
            elif path == "/v1/models":
                self._json(200, self._models())
            elif path == "/v1/images":
                self._recent(parse_qs(url.query))
            elif path.startswith("/v1/jobs/"):
                self._job(path.removeprefix("/v1/jobs/"))
            elif path.startswith("/images/"):
                self._image(unquote(path.removeprefix("/images/")))
            else:
                raise ApiError(404, f"no route {path}", code="not_found")
        except ApiError as error:
            self._error(error)

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        try:
            if not self._require_auth():
                return
            if path not in ("/v1/images/generations", "/v1/jobs"):
                self.close_connection = True
                raise ApiError(404, f"no route {path}", code="not_found")
            params = parse_params(self._read_json())
            if path == "/v1/jobs":
                job = self.engine.submit(params, keep_png=False)
                self._json(202, job_view(self.engine, job))
                return
            job = self.engine.submit(params, keep_png=True)
            job.done.wait()
            if job.status != "done":
                raise ApiError(
                    500,
                    f"generation failed: {job.error}",
                    code="generation_failed",
                    kind="server_error",
                )
            data = []
            for image in job.images:
                data.append(
                    {
                        "b64_json": base64.b64encode(image.png or b"").decode("ascii"),
                        "seed": image.seed,
                    }
                )
                image.png = None
            self._json(
                200,
                {
                    "created": int(job.created),
                    "data": data,
                    "model": self.engine.model_name,
                    "size": f"{job.width}x{job.height}",
                    "output_format": "png",
                },
            )
        except ApiError as error:
            self._error(error)

    def _health(self) -> None:
        engine = self.engine
        if engine.state == "ok":
            self._json(
                200,
                {
                    "status": "ok",
                    "model": engine.model_name,
                    "pipeline": engine.pipeline_class,
                    "device": engine.device,
                    "dtype": engine.dtype,
                    "default_size": f"{engine.default_width}x{engine.default_height}",
                    "default_guidance": engine.default_guidance,
                    "pending": engine.pending(),
                },
            )
        elif engine.state == "error":
            self._json(500, {"status": "error", "error": engine.error})
        else:
            elapsed = round(time.time() - engine.load_started, 1)
            self._json(503, {"status": "loading", "elapsed_s": elapsed}, {"Retry-After": "5"})

    def _models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": self.engine.model_name, "object": "model", "created": 0, "owned_by": "gpc"}
            ],
        }

    def _recent(self, query: dict[str, list[str]]) -> None:
        try:
            limit = int(query.get("limit", [str(RECENT_LIMIT)])[0])
        except ValueError:
            raise ApiError(400, "'limit' must be an integer", param="limit") from None
        limit = max(1, min(limit, 100))
        self._json(200, {"object": "list", "data": self.engine.recent(limit)})

    def _job(self, job_id: str) -> None:
        job = self.engine.job(job_id) if JOB_ID_RE.match(job_id) else None
        if job is None:
            raise ApiError(
                404, "no such job (finished jobs are kept for a while only)", code="not_found"
            )
        self._json(200, job_view(self.engine, job))

    def _image(self, name: str) -> None:
        path = self.engine.image_path(name)
        if path is None:
            raise ApiError(404, "no such image", code="not_found")
        try:
            data = path.read_bytes()
        except OSError:
            raise ApiError(404, "no such image", code="not_found") from None
        # The names never change content: the browser may keep them.
        self._send(200, data, "image/png", {"Cache-Control": "private, max-age=86400"})


def make_handler(engine: Engine, credentials: tuple[tuple[str, str], ...]) -> type[Handler]:
    return type("BoundHandler", (Handler,), {"engine": engine, "credentials": credentials})


def credentials_from_env() -> tuple[tuple[str, str], ...]:
    pairs = []
    if os.environ.get("GPC_APP_API_KEY"):
        pairs.append(("bearer", os.environ["GPC_APP_API_KEY"]))
    if os.environ.get("JUPYTER_TOKEN"):
        pairs.append(("token", os.environ["JUPYTER_TOKEN"]))
    return tuple(pairs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Text-to-image web UI and OpenAI-compatible API")
    parser.add_argument("--host", default=os.environ.get("GPC_BIND_ADDRESS") or "127.0.0.1")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--model-dir", default=os.environ.get("MODEL_DIR") or "")
    parser.add_argument(
        "--served-name",
        default=os.environ.get("APP_MODEL_NAME", ""),
        help="the model's name in the page and the API (default: env APP_MODEL_NAME, else the "
        "directory name)",
    )
    parser.add_argument(
        "--output-dir",
        default="",
        help="where images are saved (default: ${PFS:-/pfs}/outputs/sdxl-image)",
    )
    args = parser.parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
    )
    credentials = credentials_from_env()
    if not credentials:
        print(
            "refusing to start: set GPC_APP_API_KEY (API clients) and/or JUPYTER_TOKEN "
            "(the console's proxy) so that requests can be authenticated",
            file=sys.stderr,
        )
        return 2
    if not args.model_dir:
        print("refusing to start: no model: pass --model-dir or set MODEL_DIR", file=sys.stderr)
        return 2
    output_dir = usable_output_dir(
        Path(args.output_dir) if args.output_dir else default_output_dir()
    )
    engine = Engine(resolve(args.model_dir), output_dir, args.served_name)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(engine, credentials))
    server.daemon_threads = True
    log.info("listening on http://%s:%d/ (images saved to %s)", args.host, args.port, output_dir)
    engine.start()

    def stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
