"""The simulated fleet's driver: realistic step times and logs, failures on request.

Used by the embedded default (the digital twin) and by tests. Every delay is multiplied by
``SIM_TIME_SCALE`` (1 = realistic, 0 = instant). ``spec.sim_fail`` ("<step>" or "<step>@<rank>",
from the instance's ``SIM_FAIL`` environment variable) makes that step fail permanently;
"<step>~" fails it once with a transient error (retried).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from marketplace.recipes import PARAMETER_LIMITS
from slices.drivers import sim_slurm
from slices.drivers.base import (
    DriverError,
    GatewayGrant,
    GatewayTarget,
    InstanceSpec,
    LogFn,
    NodeTarget,
    StepResult,
    WorkloadOutput,
)
from slices.drivers.gateway import keys_file as gateway_keys_file
from slices.drivers.gateway import routes_file as gateway_routes_file
from slices.drivers.pfs import SAFE_NAME as PFS_SAFE_NAME
from slices.drivers.sim_shell import SimShell
from slices.drivers.sim_web import open_sim_tunnel
from slices.drivers.slurm import OutputChunk, RestAnswer, SlurmSetup
from slices.progress import parse_line
from slices.slurmconf import SlurmPaths
from slices.telemetry.workload import SimWorkload, workload_for

# Realistic seconds per step on one node (image pulls dominate), before scaling.
STEP_SECONDS: dict[str, float] = {
    "isolate": 4.0,
    "connect": 3.0,
    "prepare": 6.0,
    "mount": 12.0,
    "start": 45.0,
    "health": 10.0,
    "allreduce": 20.0,
    "teardown": 5.0,
}


class SimDriver:
    name = "sim"
    simulated = True
    # Simulated outages (tests, bench/soak.py): hostnames whose node stops answering, in this
    # process. A silent node fails its probes and sends no GPU samples.
    silent: set[str] = set()  # noqa: RUF012 - process-wide on purpose

    @classmethod
    def silence(cls, hostname: str) -> None:
        cls.silent.add(hostname)

    @classmethod
    def revive(cls, hostname: str | None = None) -> None:
        """``hostname`` answers again (every node when None)."""
        if hostname is None:
            cls.silent.clear()
        else:
            cls.silent.discard(hostname)

    @classmethod
    def from_settings(cls, settings: Any) -> SimDriver:
        """The driver as ``slices.drivers.registry`` makes it."""
        return cls(time_scale=settings.SIM_TIME_SCALE, state_dir=str(settings.STATE_DIR))

    def __init__(self, time_scale: float = 1.0, state_dir: str = "var") -> None:
        self.time_scale = max(0.0, float(time_scale))
        self.state_dir = state_dir  # where the simulated Slurm keeps its queues (sim_slurm)
        self._transient_seen: set[tuple[str, str, int]] = set()
        self._lock = threading.Lock()

    def step_seconds(self) -> dict[str, float]:
        return {k: v * self.time_scale for k, v in STEP_SECONDS.items()}

    # -- helpers -----------------------------------------------------------------------------
    def _sleep(self, step: str, node: NodeTarget | None = None) -> None:
        seconds = STEP_SECONDS[step] * self.time_scale
        if node is not None and seconds:
            # Nodes are not identical: ±15 % per node, stable for a hostname.
            jitter = int(hashlib.sha256(node.hostname.encode()).hexdigest()[:4], 16) / 0xFFFF
            seconds *= 0.85 + 0.3 * jitter
        if seconds > 0:
            time.sleep(seconds)

    def _maybe_fail(self, spec: InstanceSpec, step: str, node: NodeTarget | None) -> None:
        rule = spec.sim_fail.strip()
        if not rule:
            return
        transient = rule.endswith("~")
        rule = rule.rstrip("~")
        want_step, _, want_rank = rule.partition("@")
        if want_step != step:
            return
        if want_rank and (node is None or str(node.rank) != want_rank):
            return
        where = node.hostname if node else "fabric"
        if transient:
            key = (spec.instance_id, step, node.rank if node else -1)
            with self._lock:
                if key in self._transient_seen:
                    return
                self._transient_seen.add(key)
            raise DriverError("sim_transient", f"simulated transient failure at {step} on {where}")
        raise DriverError("sim_failure", f"simulated failure at {step} on {where}", permanent=True)

    def _step(
        self, spec: InstanceSpec, step: str, node: NodeTarget | None, *, takes: str = ""
    ) -> None:
        """A simulated step: fail if ``SIM_FAIL`` asks for it, else take the time of ``takes``
        (default: the step's own)."""
        self._maybe_fail(spec, step, node)
        self._sleep(takes or step, node)

    # -- steps -------------------------------------------------------------------------------
    def isolate(self, spec: InstanceSpec, log: LogFn) -> StepResult:
        self._step(spec, "isolate", None)
        log(
            f"[sim] fabric manager: partition {spec.partition_key:#06x} created with "
            f"{len(spec.nodes)} member node(s), GPUDirect RDMA enabled"
            if spec.partition_key is not None
            else "[sim] single host: no fabric partition needed"
        )
        return StepResult({"partition_key": spec.partition_key})

    def connect(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        self._step(spec, "connect", node)
        log(f"[sim] ssh {node.address}:{node.port}: host key matches the pinned key; connected")
        return StepResult()

    def probe(self, node: NodeTarget) -> StepResult:
        """The simulated node's heartbeat: it answers unless ``silence``d."""
        if node.hostname in self.silent:
            raise DriverError(
                "unreachable",
                f"{node.hostname} ({node.address}:{node.port}): simulated outage, no answer",
            )
        return StepResult({"simulated": True})

    def prepare(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        self._step(spec, "prepare", node)
        log(f"[sim] created {node.workdir}/instances/{spec.slug} and the instance user")
        log(
            f"[sim] wrote hostfile ({len(spec.nodes)} node(s)) and environment (NODE_RANK={node.rank})"
        )
        return StepResult()

    def mount(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        self._step(spec, "mount", node)
        log("[sim] mounted the parallel file system at /pfs (100 Gb/s)")
        for m in spec.mounts:
            log(f"[sim] mounted {m.source} read-only at {m.target}")
        for d in spec.disks:
            mode = "read-only" if d.read_only else "read-write"
            log(f"[sim] attached cloud disk {d.disk_id} ({d.size_gb} GB) {mode} at {d.target}")
        return StepResult()

    def start(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        self._maybe_fail(spec, "start", node)
        image = spec.image or "bare CUDA host"
        log(f"[sim] pulling {image} (cached layers on the PFS)")
        self._sleep("start", node)
        if spec.env.get("RESUME_FROM"):
            log(f"[sim] job resumes from checkpoint {spec.env['RESUME_FROM']}")
        network = "host network, host IPC" if node.exclusive else "its own network and IPC"
        log(f"[sim] started {spec.slug} with {len(node.gpus)} GPU(s), {network}")
        if node.instance_ssh_port:
            log(f"[sim] the instance's sshd listens on {node.address}:{node.instance_ssh_port}")
            return StepResult({"sshd": True, "ssh_port": node.instance_ssh_port})
        return StepResult()

    def sync_gateway(
        self, gateway: GatewayTarget, grants: tuple[GatewayGrant, ...], log: LogFn
    ) -> StepResult:
        """The simulated gateway: the keys file is built (and checked) as the ssh driver builds
        it, and only counted: nothing is written anywhere."""
        text, count = gateway_keys_file(grants)
        log(f"[sim] wrote {count} key(s) to {gateway.keys_file} on {gateway.host}")
        routes = 0
        if gateway.routes_file:
            _routes_text, routes = gateway_routes_file(gateway.routes)
            log(f"[sim] wrote {routes} route(s) to {gateway.routes_file} on {gateway.host}")
        return StepResult({"keys": count, "bytes": len(text), "routes": routes, "simulated": True})

    def open_tunnel(self, spec: InstanceSpec, node: NodeTarget, port: int) -> socket.socket:
        """A simulated web app on ``port`` (labelled so), served in this process: nothing is
        opened on the console's host (``slices.drivers.sim_web``), so a port reaches the
        instance's own stand-in only, as the port rule asks of every driver."""
        app = spec.env.get("GPC_APP", "")
        if app:  # an AI application's simulated stand-in (issue 20)
            from slices.drivers.sim_apps import open_sim_app_tunnel

            return open_sim_app_tunnel(app, port, spec.env)
        names = {8888: "JupyterLab", 6006: "TensorBoard"}
        return open_sim_tunnel(port, names.get(port, f"Web app on port {port}"))

    def health(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        self._step(spec, "health", node)
        log(f"[sim] nvidia-smi: {len(node.gpus)} GPU(s) visible, no Xid errors; sshd answering")
        return StepResult({"gpus_visible": len(node.gpus)})

    def allreduce_check(self, spec: InstanceSpec, log: LogFn) -> StepResult:
        self._step(spec, "allreduce", None)
        log(f"[sim] nccl all_reduce_perf across {len(spec.nodes)} nodes (simulated figures)")
        return StepResult({"measured": True, "simulated": True})

    def teardown(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        self._sleep("teardown", node)
        if spec.slurm_run and node.rank == 0:
            shutil.rmtree(sim_slurm.sim_root(self.state_dir, spec), ignore_errors=True)
        log(f"[sim] stopped {spec.slug}, unmounted, removed the instance directory")
        return StepResult()

    # -- the slice's simulated Slurm (issue 31: slices.drivers.sim_slurm) ----------------------
    def start_slurm(self, spec: InstanceSpec, setup: SlurmSetup, log: LogFn) -> StepResult:
        sim_slurm.check(spec)
        self._maybe_fail(spec, "slurm", None)
        return sim_slurm.start(self.state_dir, spec, setup, log)

    def slurm_request(
        self,
        spec: InstanceSpec,
        setup: SlurmSetup,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        token: str,
    ) -> RestAnswer:
        slurm = sim_slurm.for_spec(self.state_dir, spec, self.time_scale)
        return slurm.request(method, path, body)

    def slurm_output(
        self, spec: InstanceSpec, setup: SlurmSetup, job_id: int, offset: int, limit: int
    ) -> OutputChunk:
        slurm = sim_slurm.for_spec(self.state_dir, spec, self.time_scale)
        return sim_slurm.output(slurm, job_id, offset, limit)

    def slurm_paths(self, spec: InstanceSpec, setup: SlurmSetup) -> SlurmPaths:
        return sim_slurm.paths(self.state_dir, spec, setup)

    def stop(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        self._step(spec, "stop", node, takes="teardown")
        log(f"[sim] stopped {spec.slug}; kept its system disk ({spec.system_disk_gb} GB)")
        return StepResult()

    def move_disk(
        self, spec: InstanceSpec, src: NodeTarget, dst: NodeTarget, log: LogFn
    ) -> StepResult:
        self._step(spec, "move_disk", dst, takes="prepare")
        log(
            f"[sim] copied the system disk of {spec.slug} ({spec.system_disk_gb} GB) "
            f"from {src.hostname} to {dst.hostname}"
        )
        return StepResult()

    # -- the workload's output --------------------------------------------------------------
    def workload_output(
        self, spec: InstanceSpec, node: NodeTarget, offset: int, elapsed_s: float, limit: int
    ) -> WorkloadOutput:
        """The lines a recipe run has printed ``elapsed_s`` after running (simulated, scaled by
        ``SIM_TIME_SCALE``), from line ``offset``; an instance without a recipe prints nothing."""
        app = spec.env.get("GPC_APP", "")
        if node.rank == 0 and app:  # an AI application's start-up, as its server prints it
            model = spec.env.get("APP_MODEL_NAME", "the model")
            lines = [
                f"[simulated] {app}: loading {model} from {spec.env.get('MODEL_DIR', '/models')}",
                f"[simulated] {app}: model loaded; serving (canned answers, no model runs)",
            ]
            return WorkloadOutput(lines[offset : offset + max(0, limit)], True)
        if node.rank != 0 or not spec.env.get("RECIPE"):
            return WorkloadOutput([], True)
        recipe = _SimRecipe.from_env(
            spec.env, len(spec.nodes) * spec.gpus_per_node, time_scale=self.time_scale
        )
        lines = recipe.window(offset, elapsed_s, limit)
        return WorkloadOutput(lines, offset + len(lines) < recipe.total)

    def write_recipe_files(
        self, account_root: Path, env: dict[str, str], lines: list[str]
    ) -> list[str]:
        """The files a simulated recipe's checkpoint and done lines announce, written (small and
        labelled simulated) into the account's simulated PFS: see ``write_sim_recipe_files``."""
        return write_sim_recipe_files(account_root, env, lines)

    # -- the web terminal ----------------------------------------------------------------------
    def open_shell(
        self, spec: InstanceSpec, node: NodeTarget, cols: int, rows: int, *, gpu_model: str = ""
    ) -> SimShell:
        """A simulated shell (labelled so): never a shell on the console's own host. Its
        programs run in real time, or at once when ``SIM_TIME_SCALE`` is 0 (tests)."""
        self._maybe_fail(spec, "shell", node)
        return SimShell(
            spec,
            node,
            gpu_model=gpu_model,
            cols=cols,
            rows=rows,
            time_scale=1.0 if self.time_scale > 0 else 0.0,
        )

    # -- telemetry ---------------------------------------------------------------------------
    def telemetry(self, spec: InstanceSpec, node: NodeTarget, gpu_model: str) -> SimTelemetry:
        """Samples from the workload model (``workload_for``: ``SIM_WORKLOAD``, else training for
        a recipe run and idle for a host nothing runs on)."""
        return SimTelemetry(
            SimWorkload(
                instance_id=spec.instance_id,
                host=node.hostname,
                rank=node.rank,
                gpus=node.gpus,
                workload=workload_for(spec.env),
                gpu_model=gpu_model,
                started_at=time.time(),
                failing_gpu=spec.env.get("SIM_FAILING_GPU", "0"),
            )
        )


class SimTelemetry:
    """The simulated agent of one node: a sample per call, labelled simulated."""

    simulated = True

    def __init__(self, workload: SimWorkload) -> None:
        self.workload = workload
        self._seq = 0

    def read(self, now: float) -> dict[str, Any] | None:
        if self.workload.host in SimDriver.silent:
            return None  # a silent node's agent sends nothing
        self._seq += 1
        return self.workload.sample(now, self._seq)

    def close(self) -> None:
        pass


# The one-click demo's LoRA run as the simulated fleet plays it: the same structured lines as
# marketplace/recipes/llama-lora/train.py prints, marked simulated, with a falling loss. Realistic
# figures for LLaMA-7B LoRA on RTX 4090s (bf16, sequence 512, batch 4 per GPU): about 2,000
# tokens/s per GPU, a model load of about 90 s. Seconds are before SIM_TIME_SCALE.
#
# The run is a closed form of its parameters, not a list: line ``i`` and when it is printed are
# computed directly (a binary search over the steps), so a poll costs O(log MAX_STEPS) plus the
# lines it returns (at most SIM_OUTPUT_MAX_LINES), whatever the steps, the time limit or the
# elapsed time. The parameters are clamped to the catalogue loader's fixed limits as well (a launch
# refuses values outside the recipe's bounds; this is the simulator's own guard).
SIM_RECIPE_LOAD_SECONDS = 90.0
SIM_RECIPE_TOKENS_PER_GPU_S = 2000.0
SIM_CHECKPOINT_SECONDS = 2.0
SIM_OUTPUT_MAX_LINES = 1000
_HEAD_LINES = 3  # torchrun, loading, start
_TAIL_LINES = 2  # the last checkpoint, done


def _int_env(env: dict[str, str], name: str, default: int) -> int:
    """``env[name]`` as a whole number clamped to the loader's fixed limits for ``name``."""
    low, high = PARAMETER_LIMITS.get(name, (0, 10**9))
    text = str(env.get(name, default)).strip()
    value = int(text) if re.fullmatch(r"[+-]?[0-9]{1,12}", text) else default
    return max(low, min(high, value))


def _sim_line(**fields: object) -> str:
    return json.dumps({**fields, "simulated": True}, ensure_ascii=False)


def _first(low: int, high: int, pred: Any) -> int:
    """The least ``n`` in [low, high] with ``pred(n)`` (monotone), or ``high + 1``."""
    while low <= high:
        mid = (low + high) // 2
        if pred(mid):
            high = mid - 1
        else:
            low = mid + 1
    return low


@dataclass(frozen=True)
class _SimRecipe:
    """A simulated recipe run's parameters, read from its environment as train.py reads them.

    Step ``s`` ends ``step_s`` after the previous one and prints a progress line when ``s`` is a
    multiple of ``log_every`` (or the last step); a checkpoint (multiples of ``save_every`` before
    the last step) adds ``SIM_CHECKPOINT_SECONDS``. The run stops after ``stop_step``: the last
    step, or the first one after which two more would not finish 30 s before ``TIME_LIMIT_S``.
    """

    run: str
    world_size: int
    max_steps: int
    log_every: int
    save_every: int
    limit: float  # TIME_LIMIT_S, real seconds (0: none)
    tokens: int  # per step, all GPUs
    step_s: float
    seed: int
    time_scale: float
    model_dir: str = "/models"

    @classmethod
    def from_env(cls, env: dict[str, str], world_size: int, time_scale: float) -> _SimRecipe:
        run = str(env.get("RUN_NAME", "run"))[:100]
        world_size = max(1, world_size)
        tokens = world_size * _int_env(env, "BATCH_SIZE", 4) * _int_env(env, "SEQ_LEN", 512)
        return cls(
            run=run,
            world_size=world_size,
            max_steps=_int_env(env, "MAX_STEPS", 300),
            log_every=_int_env(env, "LOG_EVERY", 10),
            save_every=_int_env(env, "SAVE_EVERY", 100),
            limit=float(_int_env(env, "TIME_LIMIT_S", 0)),
            tokens=tokens,
            step_s=tokens / max(1.0, world_size * SIM_RECIPE_TOKENS_PER_GPU_S),
            seed=int(hashlib.sha256(run.encode()).hexdigest()[:8], 16),
            time_scale=time_scale,
            model_dir=str(env.get("MODEL_DIR", "/models"))[:300],
        )

    # -- the closed form ----------------------------------------------------------------------
    def _saves(self, step: int) -> int:
        """Checkpoints saved at steps 1..``step`` (not counting the last step's)."""
        return min(step, self.max_steps - 1) // self.save_every if self.save_every else 0

    def _ends(self, step: int) -> float:
        """When step ``step`` (and its checkpoint) is over, before scaling."""
        return (
            SIM_RECIPE_LOAD_SECONDS
            + step * self.step_s
            + SIM_CHECKPOINT_SECONDS * self._saves(step)
        )

    def _out_of_time(self, step: int) -> bool:
        return bool(self.limit) and (
            (self._ends(step) + 2 * self.step_s) * self.time_scale + 30 > self.limit
        )

    @cached_property
    def stop_step(self) -> int:
        return min(self.max_steps, _first(1, self.max_steps, self._out_of_time))

    @property
    def reason(self) -> str:
        return "time_limit" if self._out_of_time(self.stop_step) else "max_steps"

    def _logs(self, step: int) -> bool:
        return step % self.log_every == 0 or step == self.max_steps

    def _saves_at(self, step: int) -> bool:
        return bool(self.save_every) and step % self.save_every == 0 and step < self.max_steps

    def _lines_to(self, step: int) -> int:
        """Training lines printed by steps 1..``step`` (``step`` at most ``stop_step``)."""
        last = 1 if step >= self.max_steps and self.max_steps % self.log_every else 0
        return step // self.log_every + last + self._saves(step)

    @cached_property
    def total(self) -> int:
        return _HEAD_LINES + self._lines_to(self.stop_step) + _TAIL_LINES

    def _line(self, i: int) -> tuple[float, str]:
        """Line ``i`` (0 = the first) and when it is printed, before scaling."""
        stop = self.stop_step
        if i < _HEAD_LINES:
            return self._head(i)
        j = i - _HEAD_LINES
        trained = self._lines_to(stop)
        if j >= trained:
            t = self._ends(stop) + 3.0
            if j == trained:
                return t, self.checkpoint(stop)
            return t + 1.0, self.done(stop, t + 1.0)
        step = _first(1, stop, lambda s: self._lines_to(s) > j)
        at_progress = SIM_RECIPE_LOAD_SECONDS + step * self.step_s
        at_progress += SIM_CHECKPOINT_SECONDS * self._saves(step - 1)
        if self._logs(step) and j == self._lines_to(step - 1):
            return at_progress, self.progress(step, at_progress)
        return self._ends(step), self.checkpoint(step)

    def _at(self, i: int) -> float:
        return self._line(i)[0]

    def window(self, offset: int, elapsed_s: float, limit: int) -> list[str]:
        """The lines printed ``elapsed_s`` (scaled seconds) after running, from line ``offset``,
        at most ``limit`` (and ``SIM_OUTPUT_MAX_LINES``)."""
        total = self.total
        offset = max(0, offset)
        if offset >= total:
            return []
        due = _first(offset, total - 1, lambda i: self._at(i) * self.time_scale > elapsed_s)
        end = min(due, offset + max(0, min(limit, SIM_OUTPUT_MAX_LINES)))
        return [self._line(i)[1] for i in range(offset, end)]

    def lines(self) -> list[tuple[float, str]]:
        """The whole run (tests): ``total`` lines, so only for small runs."""
        return [self._line(i) for i in range(self.total)]

    # -- the lines ----------------------------------------------------------------------------
    def loss(self, step: int) -> float:
        wobble = ((self.seed >> (step % 24)) % 97) / 97 - 0.5
        return 1.05 + 0.85 * math.exp(-step / (self.max_steps / 5)) + 0.05 * wobble

    def checkpoint(self, step: int) -> str:
        return _sim_line(
            event="checkpoint", step=step, path=f"/pfs/checkpoints/{self.run}/step-{step}"
        )

    def progress(self, step: int, t: float) -> str:
        eta = (self.max_steps - step) * self.step_s * self.time_scale
        if self.limit:
            eta = min(eta, max(0.0, self.limit - 30 - t * self.time_scale))
        return _sim_line(
            event="progress",
            step=step,
            max_steps=self.max_steps,
            loss=round(self.loss(step), 4),
            lr=2e-4,
            tokens_per_s=round(self.tokens / self.step_s, 1),
            eta_s=round(eta, 1),
            elapsed_s=round(t * self.time_scale, 1),
        )

    def done(self, step: int, t: float) -> str:
        return _sim_line(
            event="done",
            step=step,
            loss=round(self.loss(step), 4),
            adapter=f"/pfs/adapters/{self.run}",
            reason=self.reason,
            elapsed_s=round(t * self.time_scale, 1),
        )

    def _head(self, i: int) -> tuple[float, str]:
        if i == 0:
            return 1.0, (
                f"[sim] torchrun: {self.world_size} processes, NCCL over {self.world_size} GPU(s)"
            )
        if i == 1:
            return 2.0, f"[sim] loading {self.model_dir} (bf16) on every GPU"
        return SIM_RECIPE_LOAD_SECONDS, _sim_line(
            event="start",
            run=self.run,
            world_size=self.world_size,
            device="cuda",
            trainable_params=4_194_304,
            total_params=6_742_609_920,
            max_steps=self.max_steps,
            resumed_from=None,
        )


# What the simulated recipe leaves on the PFS. The simulated fleet trains nothing, so it writes no
# weights: each checkpoint gets its real trainer_state.json (step, loss) and the adapter its
# adapter_config.json, each folder a SIMULATED.txt saying so. Small files, but real ones: the /pfs
# usage counts them, the console finds the latest checkpoint as it does for a real run, and the
# /pfs file browser lists and downloads them.
SIM_FILES_NOTE = (
    "Written by the simulated fleet (the console's digital twin): no model was trained and these\n"
    "files hold no weights. A real run writes adapter_model.safetensors (and, in a checkpoint,\n"
    "optimizer.pt) beside them.\n"
)


def _sim_dir(account_root: Path, *names: str) -> Path | None:
    """``account_root/names...``, made where missing; None where a name on the way is a symlink
    or not a folder (the simulator never writes through one)."""
    path = account_root
    for name in names:
        path = path / name
        if path.is_symlink():
            return None
        try:
            path.mkdir(exist_ok=True)
        except OSError:
            return None
        if not path.is_dir() or path.is_symlink():
            return None
    return path


def _write_folder(parent: Path, name: str, files: dict[str, str]) -> bool:
    """The folder ``parent/name`` with ``files``, whole or not at all (written beside, renamed);
    False when it is already there."""
    target = parent / name
    if target.exists() or target.is_symlink():
        return False
    # A fresh, unguessable name made here (never one that exists: a link planted under a
    # predictable name would be written through).
    temp = parent / f".{name}.tmp-{secrets.token_hex(8)}"
    try:
        temp.mkdir()
    except OSError:
        return False
    for file_name, text in files.items():
        (temp / file_name).write_text(text, encoding="utf-8")
    try:
        os.rename(temp, target)
    except OSError:  # written meanwhile by another follower pass
        shutil.rmtree(temp, ignore_errors=True)
        return False
    return True


def write_sim_recipe_files(account_root: Path, env: dict[str, str], lines: list[str]) -> list[str]:
    """For each simulated ``checkpoint`` line, ``checkpoints/<run>/step-<N>/`` and for the ``done``
    line ``adapters/<run>/`` under ``account_root`` (the account's simulated PFS directory), as
    train.py lays them out; the paths written, as a job sees them. The run's name comes from the
    environment and must be a plain name; nothing is written through a symlink or twice."""
    run = str(env.get("CHECKPOINT_RUN") or env.get("RUN_NAME") or "")
    if not PFS_SAFE_NAME.match(run) or not account_root.is_dir() or account_root.is_symlink():
        return []
    written: list[str] = []
    for line in lines:
        event = parse_line(line)
        if event is None or event.get("simulated") is not True:
            continue
        step = event.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            continue
        if event["event"] == "checkpoint":
            parent = _sim_dir(account_root, "checkpoints", run)
            state = {"step": step, "simulated": True}
            files = {
                "trainer_state.json": json.dumps(state) + "\n",
                "SIMULATED.txt": SIM_FILES_NOTE,
            }
            if parent is not None and _write_folder(parent, f"step-{step}", files):
                written.append(f"/pfs/checkpoints/{run}/step-{step}")
        elif event["event"] == "done":
            parent = _sim_dir(account_root, "adapters")
            config = {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "base_model_name_or_path": str(env.get("MODEL_DIR", ""))[:300],
                "r": _int_env(env, "LORA_R", 8),
                "lora_alpha": 2 * _int_env(env, "LORA_R", 8),
                "lora_dropout": 0.0,
                "target_modules": ["q_proj", "v_proj"],
                "simulated": True,
                "trained_steps": step,
            }
            files = {
                "adapter_config.json": json.dumps(config, indent=2) + "\n",
                "SIMULATED.txt": SIM_FILES_NOTE,
            }
            if parent is not None and _write_folder(parent, run, files):
                written.append(f"/pfs/adapters/{run}")
    return written


def sim_recipe_lines(
    env: dict[str, str], world_size: int, *, time_scale: float = 1.0
) -> list[tuple[float, str]]:
    """(seconds after running, line) for a whole simulated recipe run (tests; the driver reads a
    window of it). The seconds are before ``time_scale``; what the lines report (elapsed, ETA) and
    the time limit (``TIME_LIMIT_S``, real seconds) are on the scaled clock the user watches."""
    return _SimRecipe.from_env(env, world_size, time_scale).lines()
