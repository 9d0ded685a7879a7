"""LoRA Studio: fine-tune the mounted model in the browser (the "浏览器里微调" AI application).

A small web UI and JSON API around the console's LoRA trainer (the llama-lora recipe's
``train.py``, baked into the image at /opt/recipes/llama-lora/train.py). The user picks a dataset,
sets a few bounded parameters and starts a run; the server starts ``train.py`` as a child process
(an argv list, never a shell), reads the JSON lines it prints (start / progress / checkpoint /
done) and serves them to the page: progress, the loss curve, the log tail, where the adapter went.

    python server.py --host ${GPC_BIND_ADDRESS:-127.0.0.1} --port 7861 \
        [--model-dir DIR] [--data-root DIR ...] [--disks DIR] [--output-root DIR] \
        [--trainer PATH] [--nproc N]

Model: ``MODEL_DIR`` (or ``--model-dir``). Datasets: the mounted ``DATASET_DIR``, the entries of
``${PFS:-/pfs}/datasets/``, the cloud disks attached to the instance (``/data/disk-<id>``, or
under ``--disks``) and every ``--data-root``: a directory holding .json/.jsonl files is a dataset,
one that does not is a directory of datasets. Outputs (what train.py writes) under
``${PFS:-/pfs}`` (or ``--output-root``): ``checkpoints/<run>/step-<N>/`` and ``adapters/<run>/``;
this server keeps each run's record and full log in ``<output root>/lora-studio/<run>/``, so the
list of past runs survives a restart of the instance.

One run at a time (one model on the instance's GPUs). On more than one visible GPU (or
``--nproc N`` > 1) the run is data parallel: ``python -m torch.distributed.run`` (torchrun)
``--standalone --nproc_per_node N``; otherwise a plain ``python train.py`` (also on the CPU).

Only the standard library is imported here: the server starts in a fraction of a second and its
health check answers while torch loads in the child.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import html
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

DEFAULT_TRAINER = "/opt/recipes/llama-lora/train.py"
MAX_BODY = 1 << 20  # request bodies beyond this are refused (413)
DRAIN_MAX = 8 << 20  # an oversized body up to this is read and dropped before the 413
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,40}")
# Each integer parameter: (least, most). The recipe manifest's bounds, so a run here could also be
# launched as the recipe.
BOUNDS: dict[str, tuple[int, int]] = {
    "max_steps": (1, 5000),
    "lora_r": (1, 128),
    "batch_size": (1, 64),
    "seq_len": (16, 4096),
    "save_every": (0, 5000),
    "log_every": (1, 1000),
}
LR_BOUNDS = (1e-6, 1e-1)
# The LoRA target module sets offered (LLaMA-architecture names; train.py's --lora-targets).
TARGETS = (
    "q_proj,v_proj",
    "q_proj,k_proj,v_proj,o_proj",
    "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
)
FIELDS = {"dataset", "name", "lr", "lora_targets", *BOUNDS}
LOG_TAIL_LINES = 200
LOG_LINE_CHARS = 2000
MAX_DATASETS = 200
SCAN_ENTRIES = 2000  # directory entries looked at per dataset candidate
DATA_SUFFIXES = (".json", ".jsonl")
# train.py stops this long before its time limit to save; a run needs at least a little more.
MIN_TIME_LEFT_S = 90.0
STOP_GRACE_S = 10.0  # SIGTERM, then SIGKILL after this long
SAVE_RECORD_S = 30.0  # a going run's run.json is rewritten at least this often
ACTIVE = ("starting", "running", "stopping")


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "code"}}`` with its HTTP status."""

    def __init__(self, status: int, message: str, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def resolve(path: str) -> Path:
    """A path as the container sees it; train.py resolves its arguments the same way.

    On a bare test host (the console's ``runtime=process``) the instance's directory (the working
    directory) stands in for the container's root: /pfs and the mounts are links there. The server
    passes train.py the paths as the user sees them (/pfs/...), so the paths the API reports are
    the user's, and uses the resolved ones only to look at the files itself."""
    p = Path(path)
    if p.exists() or not p.is_absolute():
        return p
    inside = Path.cwd() / path.lstrip("/")
    return inside if inside.exists() else p


def finite(value: Any) -> float | None:
    """A JSON-safe number: NaN and infinities (a diverged loss) become null, which JSON.parse
    accepts where it would refuse ``NaN``."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def log(text: str) -> None:
    """One human-readable line to stdout: it appears in the instance's log."""
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


# --------------------------------------------------------------------------------------------
# Configuration


@dataclass
class Config:
    """What the command line and the environment say; paths kept as the user sees them."""

    trainer: Path
    model: str  # "" when no model is mounted
    output: str  # the output root as the user sees it (/pfs)
    data_roots: list[str]
    disks: str  # where the instance's cloud disks are mounted ("" for none)
    mounted_dataset: str
    nproc: int | None  # None: as many processes as visible GPUs
    keys: list[tuple[str, str]]  # (scheme, secret): ("bearer", GPC_APP_API_KEY), ("token", ...)
    deadline: float | None  # monotonic time the instance ends (TIME_LIMIT_S after start)

    @property
    def output_real(self) -> Path:
        return resolve(self.output)

    @property
    def state_dir(self) -> Path:
        return self.output_real / "lora-studio"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default=os.environ.get("GPC_BIND_ADDRESS") or "127.0.0.1")
    p.add_argument("--port", type=int, default=7861)
    p.add_argument("--model-dir", default=os.environ.get("MODEL_DIR", ""))
    p.add_argument(
        "--data-root",
        action="extend",
        nargs="+",
        default=[],
        metavar="DIR",
        help="a dataset directory (one holding .json/.jsonl files) or a directory of datasets",
    )
    p.add_argument(
        "--disks",
        default=os.environ.get("DISKS_ROOT", "/data"),
        metavar="DIR",
        help="where cloud disks are mounted: each one is searched like a --data-root",
    )
    p.add_argument("--output-root", default=os.environ.get("PFS") or "/pfs")
    p.add_argument("--trainer", default=os.environ.get("TRAINER") or DEFAULT_TRAINER)
    p.add_argument(
        "--nproc",
        type=int,
        default=int(os.environ["NPROC_PER_NODE"]) if os.environ.get("NPROC_PER_NODE") else None,
        help="training processes (default: one per visible GPU; 1 on the CPU)",
    )
    return p.parse_args(argv)


def make_config(args: argparse.Namespace) -> Config:
    """The configuration; exits 2 when no key is set (the app would be open to anyone)."""
    keys = [
        (scheme, os.environ[var])
        for scheme, var in (("bearer", "GPC_APP_API_KEY"), ("token", "JUPYTER_TOKEN"))
        if os.environ.get(var)
    ]
    if not keys:
        print(
            "lora-studio: refusing to start: set GPC_APP_API_KEY or JUPYTER_TOKEN "
            "(every request but /healthz must carry it)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    limit = os.environ.get("TIME_LIMIT_S", "")
    try:
        seconds = float(limit) if limit else 0.0
    except ValueError:
        seconds = 0.0
    return Config(
        trainer=Path(args.trainer),
        model=args.model_dir or "",
        output=args.output_root.rstrip("/") or "/",
        data_roots=list(args.data_root),
        disks=args.disks.rstrip("/") if args.disks else "",
        mounted_dataset=os.environ.get("DATASET_DIR", ""),
        nproc=args.nproc,
        keys=keys,
        deadline=time.monotonic() + seconds if seconds > 0 else None,
    )


def visible_gpus() -> int:
    """How many GPUs this instance sees: CUDA_VISIBLE_DEVICES when set, else ``nvidia-smi -L``
    (no torch import here: it would slow the server's start by seconds)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip()]
        return 0 if ids[:1] == ["-1"] else len(ids)
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run(  # noqa: S603 - fixed argv, no shell
            [smi, "-L"], capture_output=True, text=True, timeout=15, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


# --------------------------------------------------------------------------------------------
# Datasets


@dataclass(frozen=True)
class Dataset:
    path: str  # as the user sees it; what the API takes to name it
    name: str
    source: str  # "mounted", "pfs", "disk" or "dir"
    files: int
    bytes: int

    def as_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "name": self.name,
            "source": self.source,
            "files": self.files,
            "bytes": self.bytes,
        }


def data_files(real: Path) -> tuple[int, int]:
    """How many .json/.jsonl files a candidate holds (train.py reads them recursively) and their
    size; bounded, so a huge directory cannot stall the listing."""
    if real.is_file():
        return (1, real.stat().st_size) if real.suffix in DATA_SUFFIXES else (0, 0)
    count = size = seen = 0
    for top, dirs, files in os.walk(real):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in files:
            seen += 1
            if f.endswith(DATA_SUFFIXES) and not f.startswith("."):
                count += 1
                with contextlib.suppress(OSError):
                    size += (Path(top) / f).stat().st_size
        seen += len(dirs)
        if seen > SCAN_ENTRIES:
            break
    return count, size


def holds_data_directly(real: Path) -> bool:
    try:
        return any(
            e.is_file() and e.name.endswith(DATA_SUFFIXES) and not e.name.startswith(".")
            for e in real.iterdir()
        )
    except OSError:
        return False


def find_datasets(cfg: Config) -> list[Dataset]:
    """The datasets a run may use, found afresh on each call (files copied to /pfs/datasets while
    the app runs show up on the next refresh). Only these paths are accepted by ``POST /api/runs``.
    """
    found: list[Dataset] = []
    seen: set[Path] = set()

    def add(shown: str, source: str) -> None:
        real = resolve(shown)
        try:
            key = real.resolve()
        except OSError:
            return
        if key in seen or len(found) >= MAX_DATASETS:
            return
        count, size = data_files(real)
        if count:
            seen.add(key)
            found.append(Dataset(shown, Path(shown).name or shown, source, count, size))

    def children(root: str, source: str) -> None:
        real = resolve(root)
        try:
            entries = sorted(real.iterdir(), key=lambda e: e.name)
        except OSError:
            return
        for e in entries[:SCAN_ENTRIES]:
            if not e.name.startswith(".") and (e.is_dir() or e.suffix in DATA_SUFFIXES):
                add(f"{root.rstrip('/')}/{e.name}", source)

    if cfg.mounted_dataset:
        add(cfg.mounted_dataset.rstrip("/") or "/", "mounted")
    children(f"{cfg.output.rstrip('/')}/datasets", "pfs")

    def data_root(root: str, source: str) -> None:
        root = root.rstrip("/") or "/"
        if holds_data_directly(resolve(root)):
            add(root, source)  # a dataset itself
        else:
            children(root, source)  # a directory of datasets

    if cfg.disks:
        try:
            disks = sorted(e.name for e in resolve(cfg.disks).iterdir() if e.is_dir())
        except OSError:
            disks = []
        for name in disks[:SCAN_ENTRIES]:
            if not name.startswith("."):
                data_root(f"{cfg.disks}/{name}", "disk")
    for root in cfg.data_roots:
        data_root(root, "dir")
    return found


# --------------------------------------------------------------------------------------------
# Runs


# What run.json keeps of a Run.
SAVED = (
    "name", "dataset", "params", "state", "created_at", "created", "finished_at", "step",
    "max_steps", "loss", "losses", "lr", "tokens_per_s", "eta_s", "elapsed_s", "device",
    "world_size", "trainable_params", "total_params", "checkpoints", "adapter", "reason",
    "returncode", "error", "command",
)  # fmt: skip


@dataclass
class Run:
    """One training run: its parameters, what train.py reported, and (while it runs) its process.

    Everything but the process, the tail and the locks is saved to ``run.json`` in the run's
    directory, so past runs are listed after a restart."""

    name: str
    dataset: str
    params: dict[str, Any]
    directory: Path
    state: str = "starting"
    created_at: str = field(default_factory=now_iso)
    created: float = field(default_factory=time.time)  # orders the list (created_at is to 1 s)
    finished_at: str | None = None
    step: int = 0
    max_steps: int = 0
    loss: float | None = None
    losses: list[list[float | None]] = field(default_factory=list)
    lr: float | None = None
    tokens_per_s: float | None = None
    eta_s: float | None = None
    elapsed_s: float | None = None
    device: str | None = None
    world_size: int | None = None
    trainable_params: int | None = None
    total_params: int | None = None
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    adapter: str | None = None
    reason: str | None = None
    returncode: int | None = None
    error: str | None = None
    command: list[str] = field(default_factory=list)
    # Not saved:
    proc: subprocess.Popen[str] | None = None
    stop_requested: bool = False
    saved_at: float = 0.0
    ended: threading.Event = field(default_factory=threading.Event)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LINES))

    @property
    def log_path(self) -> Path:
        return self.directory / "train.log"

    def record(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SAVED}

    def save(self) -> None:
        """Write run.json beside, then rename: a reader never sees half a record."""
        self.saved_at = time.monotonic()
        tmp = self.directory / "run.json.partial"
        tmp.write_text(json.dumps(self.record(), ensure_ascii=False), encoding="utf-8")
        tmp.replace(self.directory / "run.json")

    @classmethod
    def load(cls, directory: Path) -> Run | None:
        try:
            data = json.loads((directory / "run.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("name") != directory.name:
            return None
        run = cls(
            name=directory.name,
            dataset=str(data.get("dataset", "")),
            params=data.get("params") or {},
            directory=directory,
        )
        for k in SAVED:
            if k in data and k not in ("name", "dataset", "params"):
                setattr(run, k, data[k])
        run.ended.set()
        if run.state in ACTIVE:  # the server went away while it ran: its process is gone
            run.state = "interrupted"
            run.error = run.error or "the server restarted while this run was going"
        return run

    def adapter_ready(self) -> bool:
        """The adapter train.py reported is there (a stopped run has none)."""
        if not self.adapter:
            return False
        return (resolve(self.adapter) / "adapter_config.json").is_file()

    def log_tail(self) -> list[str]:
        if self.tail:
            return list(self.tail)
        try:  # a past run: the end of its log file
            with self.log_path.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 64_000))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return []
        return [line[:LOG_LINE_CHARS] for line in text.splitlines()[-LOG_TAIL_LINES:]]

    def summary(self, cfg: Config) -> dict[str, Any]:
        return {
            "name": self.name,
            "dataset": self.dataset,
            "state": self.state,
            "step": self.step,
            "max_steps": self.max_steps,
            "loss": finite(self.loss),
            "adapter": self.adapter,
            "adapter_ready": self.adapter_ready(),
            "created_at": self.created_at,
            "finished_at": self.finished_at,
        }

    def detail(self, cfg: Config) -> dict[str, Any]:
        return {
            **self.summary(cfg),
            "params": self.params,
            "losses": [[s, finite(v)] for s, v in self.losses],
            "lr": finite(self.lr),
            "tokens_per_s": finite(self.tokens_per_s),
            "eta_s": finite(self.eta_s),
            "elapsed_s": finite(self.elapsed_s),
            "device": self.device,
            "world_size": self.world_size,
            "trainable_params": self.trainable_params,
            "total_params": self.total_params,
            "checkpoints": self.checkpoints,
            "reason": self.reason,
            "returncode": self.returncode,
            "error": self.error,
            "log": f"{cfg.output.rstrip('/')}/lora-studio/{self.name}/train.log",
            "log_tail": self.log_tail(),
        }


def int_param(body: dict[str, Any], key: str, default: int) -> int:
    """A bounded integer: a JSON integer or a string of digits (what a form sends)."""
    value = body.get(key, default)
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,9}\s*", value):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(400, f"{key} must be an integer", f"invalid_{key}")
    low, high = BOUNDS[key]
    if not low <= value <= high:
        raise ApiError(400, f"{key} must be between {low} and {high}", f"invalid_{key}")
    return value


def env_int(name: str, key: str, fallback: int) -> int:
    """The form's default from the instance's environment (the recipe's names), if in bounds."""
    try:
        value = int(os.environ.get(name, ""))
    except ValueError:
        return fallback
    low, high = BOUNDS[key]
    return value if low <= value <= high else fallback


def defaults() -> dict[str, Any]:
    try:
        lr = float(os.environ.get("LR", ""))
    except ValueError:
        lr = 2e-4
    if not LR_BOUNDS[0] <= lr <= LR_BOUNDS[1]:
        lr = 2e-4
    targets = os.environ.get("LORA_TARGETS", "")
    return {
        "max_steps": env_int("MAX_STEPS", "max_steps", 300),
        "lora_r": env_int("LORA_R", "lora_r", 8),
        "batch_size": env_int("BATCH_SIZE", "batch_size", 4),
        "seq_len": env_int("SEQ_LEN", "seq_len", 512),
        "save_every": env_int("SAVE_EVERY", "save_every", 100),
        "log_every": env_int("LOG_EVERY", "log_every", 1),
        "lr": lr,
        "lora_targets": targets if targets in TARGETS else TARGETS[0],
    }


class Studio:
    """The runs and the one process that may train at a time.

    A lock guards the runs: request threads create, read and stop them; each run's reader thread
    folds in what train.py prints."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.lock = threading.Lock()
        self.runs: dict[str, Run] = {}
        self.active: Run | None = None
        self._nproc: int | None = cfg.nproc
        self.load()

    def load(self) -> None:
        try:
            dirs = sorted(d for d in self.cfg.state_dir.iterdir() if d.is_dir())
        except OSError:
            return
        for d in dirs:
            if NAME_RE.fullmatch(d.name) and (run := Run.load(d)):
                self.runs[run.name] = run
                if run.state == "interrupted":
                    run.save()

    def nproc(self) -> int:
        if self._nproc is None:
            self._nproc = visible_gpus()
        return self._nproc

    # ---- reading

    def datasets(self) -> list[Dataset]:
        return find_datasets(self.cfg)

    def listing(self) -> dict[str, Any]:
        with self.lock:
            runs = sorted(self.runs.values(), key=lambda r: r.created, reverse=True)
            return {
                "runs": [r.summary(self.cfg) for r in runs],
                "active": self.active.name if self.active else None,
            }

    def get(self, name: str) -> dict[str, Any]:
        with self.lock:
            return self.find(name).detail(self.cfg)

    def find(self, name: str) -> Run:
        run = self.runs.get(name) if NAME_RE.fullmatch(name) else None
        if run is None:
            raise ApiError(404, f"no run named {name!r}", "run_not_found")
        return run

    # ---- starting

    def validate(self, body: dict[str, Any]) -> dict[str, Any]:
        """The run's parameters, each checked and bounded; 400 naming the first bad one."""
        unknown = sorted(set(body) - FIELDS)
        if unknown:
            raise ApiError(400, f"unknown field(s): {', '.join(unknown)}", "unknown_field")
        name = body.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ApiError(400, "name must be 1 to 40 letters, digits, '-' or '_'", "invalid_name")
        dataset = body.get("dataset")
        if not isinstance(dataset, str) or not dataset:
            raise ApiError(400, "dataset is required (one of GET api/datasets)", "invalid_dataset")
        if ".." in Path(dataset).parts or "\x00" in dataset:
            raise ApiError(400, "dataset must not contain '..'", "invalid_dataset")
        if dataset not in {d.path for d in self.datasets()}:
            raise ApiError(
                400, "dataset must be one of those listed by api/datasets", "invalid_dataset"
            )
        base = defaults()
        params: dict[str, Any] = {k: int_param(body, k, base[k]) for k in BOUNDS}
        lr = body.get("lr", base["lr"])
        if isinstance(lr, str):
            try:
                lr = float(lr)
            except ValueError:
                lr = None
        if not isinstance(lr, int | float) or isinstance(lr, bool) or not math.isfinite(lr):
            raise ApiError(400, "lr must be a number", "invalid_lr")
        if not LR_BOUNDS[0] <= lr <= LR_BOUNDS[1]:
            raise ApiError(
                400, f"lr must be between {LR_BOUNDS[0]} and {LR_BOUNDS[1]}", "invalid_lr"
            )
        params["lr"] = float(lr)
        targets = body.get("lora_targets", base["lora_targets"])
        if targets not in TARGETS:
            raise ApiError(
                400, f"lora_targets must be one of {list(TARGETS)}", "invalid_lora_targets"
            )
        params["lora_targets"] = targets
        return {"name": name, "dataset": dataset, "params": params}

    def name_taken(self, name: str) -> bool:
        """A name is used once: train.py would resume from (and overwrite) an old run's files."""
        out = self.cfg.output_real
        return (
            name in self.runs
            or (self.cfg.state_dir / name).exists()
            or (out / "checkpoints" / name).exists()
            or (out / "adapters" / name).exists()
        )

    def argv(self, run: Run, time_limit: float) -> list[str]:
        p = run.params
        args = [
            str(self.cfg.trainer),
            "--model",
            self.cfg.model,
            "--dataset",
            run.dataset,
            "--output",
            self.cfg.output,
            "--run-name",
            run.name,
            "--max-steps",
            str(p["max_steps"]),
            "--time-limit",
            str(int(time_limit)),
            "--batch-size",
            str(p["batch_size"]),
            "--seq-len",
            str(p["seq_len"]),
            "--lr",
            repr(p["lr"]),
            "--lora-r",
            str(p["lora_r"]),
            "--lora-targets",
            p["lora_targets"],
            "--save-every",
            str(p["save_every"]),
            "--log-every",
            str(p["log_every"]),
            "--resume",
            "none",
        ]
        n = self.nproc()
        if n > 1:
            return [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nnodes",
                "1",
                "--nproc_per_node",
                str(n),
                *args,
            ]
        return [sys.executable, *args]

    def time_left(self) -> float:
        """Seconds train.py may run (0: no limit): what remains of the instance's TIME_LIMIT_S,
        so that train.py saves the adapter before the instance is released."""
        if self.cfg.deadline is None:
            return 0.0
        left = self.cfg.deadline - time.monotonic()
        if left < MIN_TIME_LEFT_S:
            raise ApiError(
                409, "the instance's time is nearly up: no time left to train", "no_time"
            )
        return left

    def start(self, body: dict[str, Any]) -> dict[str, Any]:
        checked = self.validate(body)
        if not self.cfg.trainer.is_file():
            raise ApiError(409, f"the trainer is missing: {self.cfg.trainer}", "no_trainer")
        if not self.cfg.model or not resolve(self.cfg.model).is_dir():
            raise ApiError(409, "no model is mounted (MODEL_DIR)", "no_model")
        self.nproc()  # may ask nvidia-smi: before the lock, not under it
        with self.lock:
            if self.active is not None:
                raise ApiError(
                    409, f"run {self.active.name!r} is going: one run at a time", "run_active"
                )
            if self.name_taken(checked["name"]):
                raise ApiError(409, f"the name {checked['name']!r} is already used", "name_taken")
            run = Run(
                name=checked["name"],
                dataset=checked["dataset"],
                params=checked["params"],
                directory=self.cfg.state_dir / checked["name"],
                max_steps=checked["params"]["max_steps"],
            )
            run.command = self.argv(run, self.time_left())
            try:
                run.directory.mkdir(parents=True)
            except OSError as exc:
                raise ApiError(
                    409, f"cannot write under {self.cfg.output}: {exc}", "no_output"
                ) from exc
            self.runs[run.name] = run
            self.active = run
            self.spawn(run)
            return run.detail(self.cfg)

    def spawn(self, run: Run) -> None:
        """Start train.py in its own session (so stop can end the whole process group, torchrun's
        workers included) and a thread that reads its output. Called with the lock held."""
        env = dict(os.environ)
        env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "RESUME_FROM"):
            env.pop(var, None)
        log(f"run {run.name}: starting {' '.join(run.command)}")
        try:
            run.proc = subprocess.Popen(  # noqa: S603 - an argv list, never a shell
                run.command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,  # universal newlines: progress bars' \r end lines too
                encoding="utf-8",
                errors="replace",
                bufsize=1,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            run.state, run.error = "failed", f"could not start the trainer: {exc}"
            run.finished_at = now_iso()
            run.ended.set()
            self.active = None
            run.save()
            log(f"run {run.name}: {run.error}")
            return
        run.save()
        threading.Thread(
            target=self.follow, args=(run,), name=f"run-{run.name}", daemon=True
        ).start()

    # ---- following

    def follow(self, run: Run) -> None:
        proc = run.proc
        assert proc is not None and proc.stdout is not None
        with run.log_path.open("a", encoding="utf-8") as logfile:
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                if not line.strip():
                    continue
                logfile.write(line + "\n")
                logfile.flush()
                with self.lock:
                    run.tail.append(line[:LOG_LINE_CHARS])
                    self.fold(run, line)
        code = proc.wait()
        with self.lock:
            run.returncode = code
            run.finished_at = now_iso()
            run.proc = None
            if code == 0 and run.reason:  # done (even if a stop came too late to matter)
                run.state = "finished"
            elif run.stop_requested:
                run.state = "stopped"
            else:
                run.state = "failed"
                last = next((t for t in reversed(run.tail) if not t.startswith("{")), "")
                run.error = f"train.py exited with code {code}" + (f": {last}" if last else "")
            if self.active is run:
                self.active = None
            run.save()
            run.ended.set()
        log(f"run {run.name}: {run.state} at step {run.step}/{run.max_steps} (exit {code})")

    def fold(self, run: Run, line: str) -> None:
        """Take in one of train.py's JSON lines (other lines are only logged)."""
        start = line.find('{"event"')
        if start < 0:
            log(f"run {run.name}: {line[:300]}")
            return
        try:
            event = json.loads(line[start:])
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("event")
        if kind == "start":
            run.state = "running" if run.state == "starting" else run.state
            run.device = event.get("device")
            run.world_size = event.get("world_size")
            run.trainable_params = event.get("trainable_params")
            run.total_params = event.get("total_params")
            log(f"run {run.name}: training on {run.world_size} x {run.device}")
        elif kind == "progress":
            step = event.get("step")
            if isinstance(step, int):
                run.step = step
                run.loss = finite(event.get("loss"))
                if len(run.losses) < 2 * BOUNDS["max_steps"][1]:
                    run.losses.append([step, run.loss])
            if isinstance(event.get("max_steps"), int):
                run.max_steps = event["max_steps"]
            run.lr = finite(event.get("lr"))
            run.tokens_per_s = finite(event.get("tokens_per_s"))
            run.eta_s = finite(event.get("eta_s"))
            run.elapsed_s = finite(event.get("elapsed_s"))
            if run.step == run.max_steps or run.step % max(1, run.max_steps // 10) == 0:
                log(f"run {run.name}: step {run.step}/{run.max_steps} loss {run.loss}")
            if time.monotonic() - run.saved_at > SAVE_RECORD_S:
                run.save()  # a record not much behind if the server itself goes away
        elif kind == "checkpoint":
            run.checkpoints.append({"step": event.get("step"), "path": event.get("path")})
            run.save()
        elif kind == "done":
            run.adapter = event.get("adapter")
            run.reason = event.get("reason")
            run.elapsed_s = finite(event.get("elapsed_s"))
            log(f"run {run.name}: adapter saved to {run.adapter} ({run.reason})")

    # ---- stopping

    def stop(self, name: str, wait: float = 5.0) -> dict[str, Any]:
        with self.lock:
            run = self.find(name)
            if run is not self.active or run.proc is None:
                raise ApiError(409, f"run {name!r} is not going ({run.state})", "run_not_active")
            run.stop_requested = True
            run.state = "stopping"
            proc = run.proc
        log(f"run {name}: stopping")
        terminate(proc)
        run.ended.wait(wait)
        with self.lock:
            return run.detail(self.cfg)

    def shutdown(self) -> None:
        """The server is going: end a run that goes (its process group would outlive us)."""
        with self.lock:
            run = self.active
            proc = run.proc if run else None
            if run is not None:
                run.stop_requested = True
                run.error = "the server was stopped"
        if run is not None and proc is not None:
            terminate(proc)
            run.ended.wait(STOP_GRACE_S + 2)


def terminate(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to the run's process group, SIGKILL if it lingers (in the background)."""
    signal_group(proc, signal.SIGTERM)

    def escalate() -> None:
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)

    threading.Thread(target=escalate, daemon=True).start()


def signal_group(proc: subprocess.Popen[str], sig: int) -> None:
    # start_new_session: the group's id is the child's pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


# --------------------------------------------------------------------------------------------
# HTTP


class Handler(BaseHTTPRequestHandler):
    """The routes. Every request but ``GET /healthz`` carries the app's key."""

    # Every small write (headers, each streamed chunk) goes out at once: Nagle's algorithm
    # would hold it for the client's delayed acknowledgement (~40 ms on a kept-alive connection).
    disable_nagle_algorithm = True

    protocol_version = "HTTP/1.1"
    server_version = "lora-studio/1"
    studio: Studio  # set on the subclass made by serve()

    # ---- plumbing

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log(f"{self.address_string()} {format % args}")

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Errors and changes only: the page polls every second or two."""
        status = int(code) if isinstance(code, int) else 0
        if self.command not in ("GET", "HEAD") or status >= 400:
            super().log_request(code, size)

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_error_json(self, err: ApiError) -> None:
        body = {
            "error": {"message": err.message, "type": "invalid_request_error", "code": err.code}
        }
        self.send_json(err.status, body)

    def authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        scheme, _, given = header.strip().partition(" ")
        value = given.strip().encode()
        ok = False
        for want_scheme, secret in self.studio.cfg.keys:
            # Every key is compared (constant time each), whichever matched.
            same = hmac.compare_digest(value, secret.encode())
            ok = ok or (same and scheme.lower() == want_scheme)
        return ok

    def read_json(self) -> dict[str, Any]:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise ApiError(411, "send a Content-Length (no chunked bodies)", "length_required")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise ApiError(400, "bad Content-Length", "invalid_length")
        if length > MAX_BODY:
            self.close_connection = True
            if length <= DRAIN_MAX:  # read it (bounded) so the client gets the answer, not a reset
                while length > 0:
                    length -= len(self.rfile.read(min(length, 65536))) or length
            raise ApiError(413, f"the body is larger than {MAX_BODY} bytes", "body_too_large")
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw.decode("utf-8")) if raw else {}
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the body is not valid JSON: {exc}", "invalid_json") from exc
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object", "invalid_json")
        return body

    def drain(self) -> None:
        """Read (and drop) a body we will not use, so the kept-alive connection stays in step."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        if self.headers.get("Transfer-Encoding") or length > MAX_BODY or length < 0:
            self.close_connection = True
        elif length:
            self.rfile.read(length)

    # ---- routing

    def do_GET(self) -> None:  # noqa: N802
        self.route("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self.route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self.route("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self.route("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self.route("DELETE")

    def do_PATCH(self) -> None:  # noqa: N802
        self.route("PATCH")

    def route(self, method: str) -> None:
        path = urlsplit(self.path).path
        try:
            if path == "/healthz" and method == "GET":
                self.drain()
                self.health()
                return
            if not self.authorized():
                self.drain()
                self.close_connection = True
                raise ApiError(401, "a valid API key is required", "invalid_api_key")
            self.dispatch(method, path)
        except ApiError as err:
            self.send_error_json(err)
        except BrokenPipeError:
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - one bad request must not kill the server
            log(f"error on {method} {path}: {exc!r}")
            self.close_connection = True
            self.send_error_json(ApiError(500, "internal error", "internal_error"))

    def dispatch(self, method: str, path: str) -> None:
        studio = self.studio
        parts = [p for p in path.split("/") if p]
        if method == "POST" and parts == ["api", "runs"]:
            self.send_json(201, studio.start(self.read_json()))
            return
        if (
            method == "POST"
            and len(parts) == 4
            and parts[:2] == ["api", "runs"]
            and parts[3] == "stop"
        ):
            self.drain()
            self.send_json(200, studio.stop(parts[2]))
            return
        self.drain()
        if method == "GET":
            if parts == []:
                self.page()
                return
            if parts == ["api", "datasets"]:
                self.send_json(200, {"datasets": [d.as_json() for d in studio.datasets()]})
                return
            if parts == ["api", "config"]:
                self.send_json(200, self.config_json())
                return
            if parts == ["api", "runs"]:
                self.send_json(200, studio.listing())
                return
            if len(parts) == 3 and parts[:2] == ["api", "runs"]:
                self.send_json(200, studio.get(parts[2]))
                return
        known = parts in ([], ["api", "datasets"], ["api", "config"], ["api", "runs"]) or (
            parts[:2] == ["api", "runs"] and len(parts) in (3, 4)
        )
        if known:
            raise ApiError(405, f"{method} is not allowed here", "method_not_allowed")
        raise ApiError(404, f"no such path: {path}", "not_found")

    # ---- answers

    def health(self) -> None:
        cfg = self.studio.cfg
        if not cfg.trainer.is_file():
            self.send_json(503, {"status": "error", "message": f"trainer not found: {cfg.trainer}"})
            return
        active = self.studio.active
        self.send_json(
            200,
            {
                "status": "ok",
                "trainer": str(cfg.trainer),
                "model": cfg.model or None,
                "running": active.name if active else None,
            },
        )

    def config_json(self) -> dict[str, Any]:
        cfg = self.studio.cfg
        return {
            "model": cfg.model or None,
            "model_ready": bool(cfg.model) and resolve(cfg.model).is_dir(),
            "output": cfg.output,
            "defaults": defaults(),
            "bounds": {**BOUNDS, "lr": list(LR_BOUNDS)},
            "targets": list(TARGETS),
            "processes": max(1, self.studio.nproc()),
        }

    def page(self) -> None:
        lang = (
            "en"
            if self.headers.get("Accept-Language", "").strip().lower().startswith("en")
            else "zh"
        )
        data = render_page(lang, self.studio.cfg).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Language", "en" if lang == "en" else "zh-CN")
        self.send_header("Vary", "Accept-Language")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header(
            "Content-Security-Policy",
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
            "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'",
        )
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


# --------------------------------------------------------------------------------------------
# The page

LABELS: dict[str, dict[str, str]] = {
    "zh": {
        "title": "浏览器里微调",
        "subtitle": "LoRA 微调（PEFT + Transformers），适配器保存到 /pfs",
        "model": "基础模型",
        "no_model": "未挂载模型（MODEL_DIR）",
        "new_run": "新建训练",
        "dataset": "数据集",
        "no_datasets": "没有找到数据集。把 alpaca 格式（instruction、input、output）的 JSON 或 JSONL 文件放到 {root}/datasets/ 下或云盘中，然后刷新。",
        "refresh": "刷新",
        "run_name": "运行名称",
        "run_name_hint": "字母、数字、- 或 _，最多 40 个字符；每个名称只能用一次",
        "max_steps": "最大步数",
        "lora_r": "LoRA 秩 r",
        "batch_size": "批大小（每卡）",
        "seq_len": "最大序列长度",
        "lr": "学习率",
        "advanced": "更多参数",
        "save_every": "每隔多少步保存检查点（0：仅结束时）",
        "log_every": "每隔多少步记录损失",
        "targets": "LoRA 作用模块",
        "target_0": "q_proj, v_proj（默认）",
        "target_1": "注意力全部投影（q, k, v, o）",
        "target_2": "注意力与 MLP 全部投影",
        "start": "开始训练",
        "stop": "停止训练",
        "confirm_stop": "确定停止这次训练？已保存的检查点会保留，但不会保存最终适配器。",
        "run": "运行",
        "no_run": "还没有训练。选择数据集，然后点击“开始训练”。",
        "step": "步数",
        "loss": "损失",
        "speed": "速度",
        "eta": "预计剩余",
        "device": "设备",
        "log": "日志（最后 200 行）",
        "adapter": "LoRA 适配器已保存到",
        "checkpoint": "最近的检查点",
        "past_runs": "历史运行",
        "no_past": "暂无",
        "col_name": "名称",
        "col_dataset": "数据集",
        "col_state": "状态",
        "col_steps": "步数",
        "col_loss": "最终损失",
        "col_created": "开始时间",
        "col_adapter": "适配器",
        "state_starting": "启动中（加载模型）",
        "state_running": "训练中",
        "state_stopping": "正在停止",
        "state_finished": "已完成",
        "state_stopped": "已停止",
        "state_failed": "失败",
        "state_interrupted": "已中断",
        "busy": "已有训练在进行：等它结束或先停止它。",
        "error": "出错了：",
        "files": "个文件",
        "source_mounted": "已挂载",
        "source_pfs": "/pfs",
        "source_dir": "目录",
        "source_disk": "云盘",
        "seconds": "秒",
    },
    "en": {
        "title": "Fine-tune in the browser",
        "subtitle": "LoRA fine-tuning (PEFT + Transformers); adapters are saved to /pfs",
        "model": "Base model",
        "no_model": "no model mounted (MODEL_DIR)",
        "new_run": "New run",
        "dataset": "Dataset",
        "no_datasets": "No dataset found. Put JSON or JSONL files in the alpaca format (instruction, input, output) under {root}/datasets/ or on a cloud disk, then refresh.",
        "refresh": "Refresh",
        "run_name": "Run name",
        "run_name_hint": "letters, digits, - or _, at most 40; each name is used once",
        "max_steps": "Max steps",
        "lora_r": "LoRA rank r",
        "batch_size": "Batch size (per GPU)",
        "seq_len": "Max sequence length",
        "lr": "Learning rate",
        "advanced": "More parameters",
        "save_every": "Checkpoint every N steps (0: only at the end)",
        "log_every": "Log the loss every N steps",
        "targets": "LoRA target modules",
        "target_0": "q_proj, v_proj (default)",
        "target_1": "all attention projections (q, k, v, o)",
        "target_2": "all attention and MLP projections",
        "start": "Start training",
        "stop": "Stop training",
        "confirm_stop": "Stop this run? Saved checkpoints are kept, but no final adapter is saved.",
        "run": "Run",
        "no_run": "No run yet. Pick a dataset and press “Start training”.",
        "step": "Step",
        "loss": "Loss",
        "speed": "Speed",
        "eta": "Time left",
        "device": "Device",
        "log": "Log (last 200 lines)",
        "adapter": "LoRA adapter saved to",
        "checkpoint": "Latest checkpoint",
        "past_runs": "Past runs",
        "no_past": "none yet",
        "col_name": "Name",
        "col_dataset": "Dataset",
        "col_state": "State",
        "col_steps": "Steps",
        "col_loss": "Final loss",
        "col_created": "Started",
        "col_adapter": "Adapter",
        "state_starting": "starting (loading the model)",
        "state_running": "training",
        "state_stopping": "stopping",
        "state_finished": "finished",
        "state_stopped": "stopped",
        "state_failed": "failed",
        "state_interrupted": "interrupted",
        "busy": "A run is going: wait for it to end or stop it first.",
        "error": "Error: ",
        "files": "files",
        "source_mounted": "mounted",
        "source_pfs": "/pfs",
        "source_dir": "directory",
        "source_disk": "cloud disk",
        "seconds": "s",
    },
}

PAGE = """<!doctype html>
<html lang="{{lang}}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{{title}}</title>
<style>
:root { --fg:#1d2430; --muted:#667085; --line:#e4e7ec; --bg:#f6f7f9; --card:#fff;
  --accent:#2563eb; --danger:#dc2626; --ok:#16a34a; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.5 system-ui,-apple-system,"PingFang SC","Microsoft YaHei",sans-serif;
  color:var(--fg); background:var(--bg); }
header { padding:16px 24px; background:var(--card); border-bottom:1px solid var(--line); }
header h1 { margin:0; font-size:20px; }
header p { margin:2px 0 0; color:var(--muted); }
main { display:grid; grid-template-columns:minmax(280px,360px) 1fr; gap:16px; padding:16px 24px;
  max-width:1400px; }
@media (max-width:860px) { main { grid-template-columns:1fr; } }
section { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:16px; }
section h2 { margin:0 0 12px; font-size:16px; }
label { display:block; margin:10px 0 4px; font-weight:600; }
.hint { color:var(--muted); font-size:12px; font-weight:normal; }
input, select { width:100%; padding:6px 8px; border:1px solid #cfd4dc; border-radius:6px;
  font:inherit; background:#fff; }
.row { display:flex; gap:8px; }
.row > div { flex:1; }
button { padding:8px 14px; border:0; border-radius:6px; background:var(--accent); color:#fff;
  font:inherit; font-weight:600; cursor:pointer; }
button.secondary { background:#eef2f7; color:var(--fg); }
button.danger { background:var(--danger); }
button:disabled { opacity:.5; cursor:not-allowed; }
details { margin-top:10px; }
summary { cursor:pointer; color:var(--accent); }
.actions { margin-top:16px; display:flex; gap:8px; align-items:center; }
.msg { margin-top:10px; color:var(--danger); white-space:pre-wrap; }
.muted { color:var(--muted); }
.stats { display:grid; grid-template-columns:repeat(auto-fit,minmax(120px,1fr)); gap:8px;
  margin:8px 0; }
.stat { background:var(--bg); border-radius:6px; padding:6px 10px; }
.stat b { display:block; font-size:16px; }
progress { width:100%; height:14px; }
#status { font-weight:600; }
.state-finished { color:var(--ok); } .state-failed, .state-interrupted { color:var(--danger); }
#chart { width:100%; height:220px; background:var(--bg); border-radius:6px; display:block; }
pre#log { background:#0f172a; color:#e2e8f0; padding:10px; border-radius:6px; max-height:260px;
  overflow:auto; font-size:12px; white-space:pre-wrap; word-break:break-all; margin:0; }
.adapter { margin:10px 0; padding:8px 10px; background:#ecfdf3; border-radius:6px; }
code { font-family:ui-monospace,Menlo,Consolas,monospace; }
table { width:100%; border-collapse:collapse; }
th, td { text-align:left; padding:6px 8px; border-bottom:1px solid var(--line); }
td[class^="state-"] { white-space:nowrap; }
tr.pick { cursor:pointer; } tr.pick:hover { background:var(--bg); }
.wide { grid-column:1 / -1; }
</style>
</head>
<body>
<header>
  <h1>{{title}}</h1>
  <p>{{subtitle}} · {{model}}: <code id="model">{{model_name}}</code></p>
</header>
<main>
<section>
  <h2>{{new_run}}</h2>
  <form id="form" autocomplete="off">
    <label for="dataset">{{dataset}}</label>
    <div class="row"><div><select id="dataset" name="dataset" required></select></div>
      <button type="button" class="secondary" id="refresh">{{refresh}}</button></div>
    <div id="no-datasets" class="hint" hidden>{{no_datasets}}</div>
    <label for="run-name">{{run_name}} <span class="hint">{{run_name_hint}}</span></label>
    <input id="run-name" name="name" required maxlength="40" pattern="[A-Za-z0-9_\\-]{1,40}">
    <div class="row">
      <div><label for="max-steps">{{max_steps}}</label>
        <input id="max-steps" name="max_steps" type="number" required></div>
      <div><label for="lora-r">{{lora_r}}</label>
        <input id="lora-r" name="lora_r" type="number" required></div>
    </div>
    <div class="row">
      <div><label for="batch-size">{{batch_size}}</label>
        <input id="batch-size" name="batch_size" type="number" required></div>
      <div><label for="seq-len">{{seq_len}}</label>
        <input id="seq-len" name="seq_len" type="number" required></div>
    </div>
    <label for="lr">{{lr}}</label>
    <input id="lr" name="lr" type="number" step="any" required>
    <details>
      <summary>{{advanced}}</summary>
      <label for="lora-targets">{{targets}}</label>
      <select id="lora-targets" name="lora_targets">
        <option value="0">{{target_0}}</option><option value="1">{{target_1}}</option>
        <option value="2">{{target_2}}</option></select>
      <div class="row">
        <div><label for="save-every">{{save_every}}</label>
          <input id="save-every" name="save_every" type="number" required></div>
        <div><label for="log-every">{{log_every}}</label>
          <input id="log-every" name="log_every" type="number" required></div>
      </div>
    </details>
    <div class="actions"><button id="start" type="submit">{{start}}</button></div>
    <div id="form-msg" class="msg" role="alert"></div>
  </form>
</section>
<section>
  <h2>{{run}}: <span id="run-title" class="muted">—</span></h2>
  <div id="no-run" class="muted">{{no_run}}</div>
  <div id="run-view" hidden>
    <div><span id="status"></span> <span id="run-error" class="msg"></span></div>
    <progress id="progress" max="1" value="0"></progress>
    <div class="stats">
      <div class="stat">{{step}}<b id="step-text">0 / 0</b></div>
      <div class="stat">{{loss}}<b id="loss-text">—</b></div>
      <div class="stat">{{speed}}<b id="speed-text">—</b></div>
      <div class="stat">{{eta}}<b id="eta-text">—</b></div>
      <div class="stat">{{device}}<b id="device-text">—</b></div>
    </div>
    <svg id="chart" viewBox="0 0 600 220" preserveAspectRatio="none" role="img"
      aria-label="{{loss}}"></svg>
    <div id="adapter-box" class="adapter" hidden>{{adapter}} <code id="adapter"></code></div>
    <div id="checkpoint-box" class="muted" hidden>{{checkpoint}}: <code id="checkpoint"></code></div>
    <div class="actions"><button id="stop" class="danger" type="button" hidden>{{stop}}</button></div>
    <h3>{{log}}</h3>
    <pre id="log"></pre>
  </div>
</section>
<section class="wide">
  <h2>{{past_runs}}</h2>
  <table><thead><tr><th>{{col_name}}</th><th>{{col_dataset}}</th><th>{{col_state}}</th>
    <th>{{col_steps}}</th><th>{{col_loss}}</th><th>{{col_created}}</th><th>{{col_adapter}}</th>
    </tr></thead><tbody id="runs"></tbody></table>
  <div id="no-past" class="muted">{{no_past}}</div>
</section>
</main>
<script>
"use strict";
const L = {{labels_json}};
const $ = (id) => document.getElementById(id);
let config = null, shown = null, timer = null, targets = [];

async function api(path, options) {
  const r = await fetch(path, Object.assign({headers: {"Content-Type": "application/json"},
    credentials: "same-origin"}, options || {}));
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) {
    const m = body && body.error && body.error.message ? body.error.message : ("HTTP " + r.status);
    const err = new Error(m); err.status = r.status; throw err;
  }
  return body;
}
function text(id, value) { $(id).textContent = value; }
function fmtLoss(v) { return v === null || v === undefined ? "—" : Number(v).toFixed(4); }
function fmtSecs(s) {
  if (s === null || s === undefined) return "—";
  s = Math.round(s); const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60);
  return h ? h + "h" + m + "m" : m ? m + "m" + (s % 60) + "s" : s + L.seconds;
}
function stateLabel(s) { return L["state_" + s] || s; }
function newName() {
  const d = new Date(), p = (n) => String(n).padStart(2, "0");
  return "lora-" + d.getFullYear() + p(d.getMonth() + 1) + p(d.getDate()) + "-" +
    p(d.getHours()) + p(d.getMinutes()) + p(d.getSeconds());
}

async function loadConfig() {
  config = await api("api/config");
  targets = config.targets;
  const d = config.defaults, b = config.bounds;
  const fields = {"max-steps": "max_steps", "lora-r": "lora_r", "batch-size": "batch_size",
    "seq-len": "seq_len", "save-every": "save_every", "log-every": "log_every"};
  for (const [id, key] of Object.entries(fields)) {
    $(id).min = b[key][0]; $(id).max = b[key][1]; $(id).value = d[key];
  }
  $("lr").min = b.lr[0]; $("lr").max = b.lr[1]; $("lr").value = d.lr;
  $("lora-targets").value = String(Math.max(0, targets.indexOf(d.lora_targets)));
  $("run-name").value = newName();
  if (!config.model_ready) { text("model", L.no_model); }
}

async function loadDatasets() {
  const sel = $("dataset"), keep = sel.value;
  const data = await api("api/datasets");
  sel.textContent = "";
  for (const ds of data.datasets) {
    const o = document.createElement("option");
    o.value = ds.path;
    o.textContent = ds.name + "  (" + (L["source_" + ds.source] || ds.source) + ", " + ds.files +
      " " + L.files + ", " + (ds.bytes / 1024).toFixed(ds.bytes < 10240 ? 1 : 0) + " KB) · " +
      ds.path;
    o.title = ds.path;
    sel.appendChild(o);
  }
  if (keep && data.datasets.some((d) => d.path === keep)) sel.value = keep;
  $("no-datasets").hidden = data.datasets.length > 0;
  $("no-datasets").textContent = L.no_datasets.replace("{root}", config ? config.output : "/pfs");
}

function drawChart(points) {
  const svg = $("chart"), W = 600, H = 220, pad = {l: 44, r: 10, t: 10, b: 22};
  svg.textContent = "";
  const pts = points.filter((p) => p[1] !== null);
  if (!pts.length) return;
  const every = Math.ceil(pts.length / 600);
  const use = pts.filter((p, i) => i % every === 0 || i === pts.length - 1);
  const xs = use.map((p) => p[0]), ys = use.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => pad.l + (x - x0) / (x1 - x0) * (W - pad.l - pad.r);
  const sy = (y) => pad.t + (1 - (y - y0) / (y1 - y0)) * (H - pad.t - pad.b);
  const ns = svg.namespaceURI;
  const el = (tag, attrs, content) => {
    const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (content !== undefined) e.textContent = content;
    svg.appendChild(e); return e;
  };
  for (const f of [0, 0.5, 1]) {
    const y = y0 + f * (y1 - y0);
    el("line", {x1: pad.l, x2: W - pad.r, y1: sy(y), y2: sy(y), stroke: "#d0d5dd",
      "stroke-width": 1, "vector-effect": "non-scaling-stroke"});
    el("text", {x: 4, y: sy(y) + 4, "font-size": 11, fill: "#667085"}, y.toFixed(3));
  }
  el("text", {x: pad.l, y: H - 6, "font-size": 11, fill: "#667085"}, String(x0));
  el("text", {x: W - pad.r, y: H - 6, "font-size": 11, fill: "#667085", "text-anchor": "end"},
    L.step + " " + x1);
  el("polyline", {points: use.map((p) => sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1)).join(" "),
    fill: "none", stroke: "#2563eb", "stroke-width": 2, "vector-effect": "non-scaling-stroke"});
}

function showRun(run) {
  shown = run.name;
  $("no-run").hidden = true; $("run-view").hidden = false;
  text("run-title", run.name + " · " + run.dataset);
  const st = $("status");
  st.textContent = stateLabel(run.state); st.className = "state-" + run.state;
  text("run-error", run.error ? " " + run.error : "");
  $("progress").max = Math.max(1, run.max_steps); $("progress").value = run.step;
  text("step-text", run.step + " / " + run.max_steps);
  text("loss-text", fmtLoss(run.loss));
  const going = ["starting", "running"].includes(run.state);
  text("speed-text", going && run.tokens_per_s ? Math.round(run.tokens_per_s) + " tok/s" : "—");
  text("eta-text", going ? fmtSecs(run.eta_s) : "—");
  text("device-text", run.device ? (run.world_size || 1) + " × " + run.device : "—");
  drawChart(run.losses || []);
  const ready = run.adapter && run.adapter_ready;
  $("adapter-box").hidden = !ready; text("adapter", ready ? run.adapter : "");
  const cps = run.checkpoints || [];
  $("checkpoint-box").hidden = ready || !cps.length;
  text("checkpoint", cps.length ? cps[cps.length - 1].path : "");
  $("stop").hidden = !going; $("stop").disabled = run.state === "stopping";
  const log = $("log"), atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 8;
  log.textContent = (run.log_tail || []).join("\\n");
  if (atEnd) log.scrollTop = log.scrollHeight;
}

function renderRuns(list) {
  const body = $("runs"); body.textContent = "";
  $("no-past").hidden = list.runs.length > 0;
  for (const r of list.runs) {
    const tr = document.createElement("tr"); tr.className = "pick";
    const cells = [r.name, r.dataset, stateLabel(r.state), r.step + " / " + r.max_steps,
      fmtLoss(r.loss), (r.created_at || "").replace("T", " ").slice(0, 19),
      r.adapter_ready ? r.adapter : "—"];
    cells.forEach((c, i) => {
      const td = document.createElement("td");
      if (i === 6 && r.adapter_ready) { const code = document.createElement("code");
        code.textContent = c; td.appendChild(code); } else td.textContent = c;
      if (i === 2) td.className = "state-" + r.state;
      tr.appendChild(td);
    });
    tr.addEventListener("click", () => { shown = r.name; refresh(); });
    body.appendChild(tr);
  }
  $("start").disabled = !!list.active || !(config && config.model_ready);
}

async function refresh() {
  clearTimeout(timer);
  let going = false;
  try {
    const list = await api("api/runs");
    renderRuns(list);
    const name = shown || list.active || (list.runs[0] && list.runs[0].name);
    if (name) {
      const run = await api("api/runs/" + encodeURIComponent(name));
      showRun(run);
      going = ["starting", "running", "stopping"].includes(run.state);
    }
    if (list.active && !going) going = true;
  } catch (e) { text("form-msg", L.error + e.message); }
  timer = setTimeout(refresh, going ? 1500 : 6000);
}

$("form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  text("form-msg", "");
  const num = (id) => Number($(id).value);
  const body = {dataset: $("dataset").value, name: $("run-name").value.trim(),
    max_steps: num("max-steps"), lora_r: num("lora-r"), batch_size: num("batch-size"),
    seq_len: num("seq-len"), lr: num("lr"), save_every: num("save-every"),
    log_every: num("log-every"), lora_targets: targets[Number($("lora-targets").value)]};
  $("start").disabled = true;
  try {
    const run = await api("api/runs", {method: "POST", body: JSON.stringify(body)});
    shown = run.name; $("run-name").value = newName(); showRun(run);
  } catch (e) {
    text("form-msg", (e.status === 409 && /one run/.test(e.message) ? L.busy + "\\n" : "") +
      L.error + e.message);
  }
  refresh();
});
$("stop").addEventListener("click", async () => {
  if (!shown || !confirm(L.confirm_stop)) return;
  $("stop").disabled = true;
  try { showRun(await api("api/runs/" + encodeURIComponent(shown) + "/stop", {method: "POST"})); }
  catch (e) { text("form-msg", L.error + e.message); }
  refresh();
});
$("refresh").addEventListener("click", () => loadDatasets().catch((e) =>
  text("form-msg", L.error + e.message)));

loadConfig().then(loadDatasets).catch((e) => text("form-msg", L.error + e.message))
  .finally(refresh);
</script>
</body>
</html>
"""


def render_page(lang: str, cfg: Config) -> str:
    """The page in one language: ``{{key}}`` filled with escaped labels; the labels also go to the
    script as JSON (``<`` escaped, so no label can close the script element)."""
    labels = LABELS[lang]
    values = {
        **{k: html.escape(v) for k, v in labels.items()},
        "lang": "en" if lang == "en" else "zh-CN",
        "model_name": html.escape(cfg.model or labels["no_model"]),
        "labels_json": json.dumps(labels, ensure_ascii=False).replace("<", "\\u003c"),
    }
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], PAGE)


# --------------------------------------------------------------------------------------------


def serve(cfg: Config, host: str, port: int) -> None:
    studio = Studio(cfg)
    handler = type("BoundHandler", (Handler,), {"studio": studio})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    log(
        f"lora-studio on http://{host}:{server.server_port}/ trainer={cfg.trainer} "
        f"model={cfg.model or '-'} output={cfg.output} datasets={len(studio.datasets())}"
    )
    if not cfg.trainer.is_file():
        log(f"warning: the trainer is missing: {cfg.trainer} (/healthz answers 503)")
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        log("shutting down")
    finally:
        studio.shutdown()
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = make_config(args)
    serve(cfg, args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
