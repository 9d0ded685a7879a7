"""The simulated fleet's GPU workload model: what the agent would print on a node that runs
the instance's job. Pure and deterministic (a function of instance, node, GPU and second), so two
relays agree and tests can predict it. Every sample says ``"simulated": true``.

Workloads (the instance's ``SIM_WORKLOAD`` environment variable; by default ``training`` for an
instance that runs a training recipe, ``idle`` for any other: a host that was only started runs
nothing on its GPUs, and reads idle, issue 29):

- ``training``: 90-99 % utilisation, memory nearly full, with a dip to a few per cent while a
  checkpoint is written (``CHECKPOINT_SECONDS`` long, every ``CHECKPOINT_EVERY`` seconds);
- ``idle``: near zero (a notebook left open: memory held, no kernels running);
- ``failing``: training, but one GPU (``SIM_FAILING_GPU``, default ``0`` = rank 0 GPU 0) reports
  an Xid error every ``XID_EVERY`` seconds with growing uncorrected ECC counts, and falls off the
  bus (Xid 79, then ``lost``) after ``LOST_AFTER`` seconds.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

WORKLOADS = ("training", "idle", "failing")
CHECKPOINT_EVERY = 300
CHECKPOINT_SECONDS = 25
XID_EVERY = 30
LOST_AFTER = 240
XID_CYCLE = (48, 63, 94)


@dataclass(frozen=True)
class GpuProfile:
    name: str
    memory_mib: float
    power_limit_w: float
    idle_power_w: float
    sm_clock_mhz: int
    mem_clock_mhz: int


PROFILES: dict[str, GpuProfile] = {
    "H800": GpuProfile("NVIDIA H800", 81559.0, 700.0, 72.0, 1980, 2619),
    "A800": GpuProfile("NVIDIA A800-SXM4-80GB", 81920.0, 400.0, 58.0, 1410, 1593),
    "RTX4090": GpuProfile("NVIDIA GeForce RTX 4090", 24564.0, 450.0, 22.0, 2520, 10501),
}
DEFAULT_PROFILE = PROFILES["H800"]


# The relay asks for every GPU of the fleet every second: what does not change with the second is
# worked out once.
@lru_cache(maxsize=64)
def profile_for(gpu_model: str) -> GpuProfile:
    return PROFILES.get(gpu_model.replace(" ", "").upper(), DEFAULT_PROFILE)


def workload_for(env: dict[str, str]) -> str:
    """The instance's simulated workload: ``SIM_WORKLOAD`` when it names one, else ``training``
    for a recipe run (``RECIPE`` set: it trains from the start) and ``idle`` for anything else."""
    asked = env.get("SIM_WORKLOAD", "")
    if asked in WORKLOADS:
        return asked
    return "training" if env.get("RECIPE") else "idle"


def _noise(*parts: object) -> float:
    """A stable pseudo-random number in [0, 1) for these parts."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@lru_cache(maxsize=1024)
def _phase(instance_id: str) -> int:
    """Where in its checkpoint cycle the instance's job started."""
    return int(_noise(instance_id) * CHECKPOINT_EVERY)


@lru_cache(maxsize=1 << 16)
def sim_uuid(instance_id: str, host: str, index: int) -> str:
    h = hashlib.blake2b(f"{host}/{index}".encode(), digest_size=16).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass(frozen=True)
class SimWorkload:
    """One node's GPUs running one instance's job, as the simulated agent reports them."""

    instance_id: str
    host: str
    rank: int
    gpus: tuple[int, ...]
    workload: str = "training"
    gpu_model: str = "H800"
    started_at: float = 0.0
    failing_gpu: str = "0"  # "<gpu>" on rank 0, or "<rank>:<gpu>"

    def _is_failing(self, index: int) -> bool:
        if self.workload != "failing":
            return False
        rank, _, gpu = self.failing_gpu.rpartition(":")
        return int(rank or 0) == self.rank and gpu.isdigit() and int(gpu) == index

    def _busy(self, second: int) -> float:
        """Fraction of full load at this second (the same for every GPU of a synchronous job)."""
        if self.workload == "idle":
            return 0.0
        in_cycle = (second + _phase(self.instance_id)) % CHECKPOINT_EVERY
        if in_cycle < CHECKPOINT_SECONDS:
            return 0.04  # writing a checkpoint: GPUs wait on the file system
        return 0.93

    def gpu(self, index: int, now: float) -> dict[str, Any]:
        second = int(now)
        profile = profile_for(self.gpu_model)
        n = _noise(self.instance_id, self.host, index, second)
        busy = self._busy(second)
        elapsed = max(0.0, now - self.started_at)
        failing = self._is_failing(index)
        if failing and elapsed >= LOST_AFTER + 1:
            return {"index": index, "state": "lost", "error": "GpuIsLost: GPU is lost"}
        if self.workload == "idle":
            util = 1.0 if n > 0.97 else 0.0
            mem = profile.memory_mib * 0.06 + 64 * index
        else:
            util = min(100.0, max(0.0, busy * 100 + (n - 0.5) * 10))
            mem = profile.memory_mib * (0.91 if busy > 0.5 else 0.88) + 37 * index
        # Temperature follows load slowly: a smoothed load over the last minute or so.
        warm = busy if elapsed > 90 else busy * min(1.0, elapsed / 90)
        temp = 33 + 38 * warm + 3 * math.sin(second / 47 + index) + (n - 0.5) * 2
        power = profile.idle_power_w + (profile.power_limit_w - profile.idle_power_w) * (
            util / 100
        ) * (0.9 + 0.08 * n)
        xids: list[int] = []
        ecc = 0
        if failing:
            ecc = int(elapsed // XID_EVERY)
            if second % XID_EVERY == 0 and elapsed >= XID_EVERY:
                xids.append(XID_CYCLE[(second // XID_EVERY) % len(XID_CYCLE)])
            if LOST_AFTER <= elapsed < LOST_AFTER + 1:
                xids.append(79)  # fell off the bus
        throttle = ["sw_power_cap"] if power > profile.power_limit_w * 0.92 else []
        if util == 0:
            throttle = ["gpu_idle"]
        return {
            "index": index,
            "uuid": sim_uuid(self.instance_id, self.host, index),
            "name": profile.name,
            "state": "ok",
            "util_gpu": round(util),
            "util_mem": round(util * 0.45),
            "mem_used_mib": round(mem, 1),
            "mem_total_mib": profile.memory_mib,
            "temp_c": round(temp),
            "power_w": round(power, 1),
            "power_limit_w": profile.power_limit_w,
            "sm_clock_mhz": profile.sm_clock_mhz if util > 5 else 345,
            "mem_clock_mhz": profile.mem_clock_mhz if util > 5 else 405,
            "pcie_tx_kbps": round(util * 900 * (0.8 + 0.4 * n)),
            "pcie_rx_kbps": round(util * 1400 * (0.8 + 0.4 * n)),
            "ecc_corrected": 0,
            "ecc_uncorrected": ecc,
            "throttle": throttle,
            "xid": xids,
        }

    def sample(self, now: float, seq: int = 0) -> dict[str, Any]:
        """The node's sample, in the agent's line format, labelled simulated."""
        return {
            "v": 1,
            "kind": "sample",
            "host": self.host,
            "ts": round(now, 3),
            "seq": seq,
            "state": "ok",
            "simulated": True,
            "gpus": [self.gpu(i, now) for i in self.gpus],
        }
