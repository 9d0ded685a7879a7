"""The simulated fleet's driver: realistic step times and logs, failures on request.

Used by the embedded default (the digital twin) and by tests. Every delay is multiplied by
``SIM_TIME_SCALE`` (1 = realistic, 0 = instant). ``spec.sim_fail`` ("<step>" or "<step>@<rank>",
from the instance's ``SIM_FAIL`` environment variable) makes that step fail permanently;
"<step>~" fails it once with a transient error (retried).
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

from slices.drivers.base import DriverError, InstanceSpec, LogFn, NodeTarget, StepResult
from slices.telemetry.workload import WORKLOADS, SimWorkload

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

    def __init__(self, time_scale: float = 1.0) -> None:
        self.time_scale = max(0.0, float(time_scale))
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

    # -- steps -------------------------------------------------------------------------------
    def isolate(self, spec: InstanceSpec, log: LogFn) -> StepResult:
        self._maybe_fail(spec, "isolate", None)
        self._sleep("isolate")
        log(
            f"[sim] fabric manager: partition {spec.partition_key:#06x} created with "
            f"{len(spec.nodes)} member node(s), GPUDirect RDMA enabled"
            if spec.partition_key is not None
            else "[sim] single host: no fabric partition needed"
        )
        return StepResult({"partition_key": spec.partition_key})

    def connect(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        self._maybe_fail(spec, "connect", node)
        self._sleep("connect", node)
        log(f"[sim] ssh {node.address}:{node.port}: host key matches the pinned key; connected")
        return StepResult()

    def prepare(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        self._maybe_fail(spec, "prepare", node)
        self._sleep("prepare", node)
        log(f"[sim] created {node.workdir}/instances/{spec.slug} and the instance user")
        log(
            f"[sim] wrote hostfile ({len(spec.nodes)} node(s)) and environment (NODE_RANK={node.rank})"
        )
        return StepResult()

    def mount(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        self._maybe_fail(spec, "mount", node)
        self._sleep("mount", node)
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
        log(f"[sim] started {spec.slug} with {len(node.gpus)} GPU(s), host network, host IPC")
        return StepResult()

    def health(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        self._maybe_fail(spec, "health", node)
        self._sleep("health", node)
        log(f"[sim] nvidia-smi: {len(node.gpus)} GPU(s) visible, no Xid errors; sshd answering")
        return StepResult({"gpus_visible": len(node.gpus)})

    def allreduce_check(self, spec: InstanceSpec, log: LogFn) -> StepResult:
        self._maybe_fail(spec, "allreduce", None)
        self._sleep("allreduce")
        log(f"[sim] nccl all_reduce_perf across {len(spec.nodes)} nodes (simulated figures)")
        return StepResult({"measured": True, "simulated": True})

    def teardown(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        self._sleep("teardown", node)
        log(f"[sim] stopped {spec.slug}, unmounted, removed the instance directory")
        return StepResult()

    def stop(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        self._maybe_fail(spec, "stop", node)
        self._sleep("teardown", node)
        log(f"[sim] stopped {spec.slug}; kept its system disk ({spec.system_disk_gb} GB)")
        return StepResult()

    def move_disk(
        self, spec: InstanceSpec, src: NodeTarget, dst: NodeTarget, log: LogFn
    ) -> StepResult:
        self._maybe_fail(spec, "move_disk", dst)
        self._sleep("prepare", dst)
        log(
            f"[sim] copied the system disk of {spec.slug} ({spec.system_disk_gb} GB) "
            f"from {src.hostname} to {dst.hostname}"
        )
        return StepResult()

    # -- telemetry ---------------------------------------------------------------------------
    def telemetry(self, spec: InstanceSpec, node: NodeTarget, gpu_model: str) -> SimTelemetry:
        """Samples from the workload model (``SIM_WORKLOAD``: training, idle or failing)."""
        workload = spec.env.get("SIM_WORKLOAD", "training")
        return SimTelemetry(
            SimWorkload(
                instance_id=spec.instance_id,
                host=node.hostname,
                rank=node.rank,
                gpus=node.gpus,
                workload=workload if workload in WORKLOADS else "training",
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

    def read(self, now: float) -> dict[str, Any]:
        self._seq += 1
        return self.workload.sample(now, self._seq)

    def close(self) -> None:
        pass
