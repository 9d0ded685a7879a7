"""Samples as the console handles them: the agent's JSON lines parsed and checked, and the compact
rows that travel to browsers and live in the ring. Pure: no Django.

A node sample is what the agent prints once a second (``slices.agent.nvml_agent``) or what the
simulated driver produces in the same shape. Anything a node sends is untrusted input: a line that
is not a valid sample raises ``SampleError`` and is dropped by the relay, never half-applied.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
NODE_STATES = frozenset({"ok", "nvml_unavailable", "nvml_error"})
GPU_STATES = frozenset({"ok", "lost"})
MAX_GPUS_PER_NODE = 64
MAX_LINE_BYTES = 256 * 1024

# The columns of one GPU in a ring entry and a live message (a list per GPU keeps them small).
ROW_COLUMNS = ("node", "gpu", "util", "mem_used", "temp", "power", "xid", "lost")


class SampleError(ValueError):
    """A line that is not a valid sample (bad JSON, wrong schema, impossible values)."""


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    state: str = "ok"
    uuid: str = ""
    name: str = ""
    util_gpu: float | None = None
    util_mem: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    pcie_tx_kbps: float | None = None
    pcie_rx_kbps: float | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    throttle: tuple[str, ...] = ()
    xid: tuple[int, ...] = ()
    error: str = ""

    @property
    def lost(self) -> bool:
        return self.state == "lost"

    def detail(self) -> dict[str, Any]:
        """Everything the agent read, for the instance page's per-GPU table."""
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "state": self.state,
            "util_mem": self.util_mem,
            "mem_total": self.mem_total_mib,
            "power_limit": self.power_limit_w,
            "sm_clock": self.sm_clock_mhz,
            "mem_clock": self.mem_clock_mhz,
            "pcie_tx": self.pcie_tx_kbps,
            "pcie_rx": self.pcie_rx_kbps,
            "ecc_corrected": self.ecc_corrected,
            "ecc_uncorrected": self.ecc_uncorrected,
            "throttle": list(self.throttle),
            "xid": list(self.xid),
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class NodeSample:
    host: str
    ts: float
    seq: int = 0
    state: str = "ok"
    error: str = ""
    simulated: bool = False
    gpus: tuple[GpuSample, ...] = field(default_factory=tuple)


def _number(raw: dict[str, Any], key: str, lo: float, hi: float, *, integer: bool = False) -> Any:
    value = raw.get(key)
    if value is None:
        return None
    kind = type(value)  # exact types: bool (a subclass of int) is refused; called 30,000×/s
    if kind is int:
        if lo <= value <= hi:
            return value
    elif kind is float:
        if lo <= value <= hi:  # NaN compares false: refused below as not finite
            return int(value) if integer else value
        if not math.isfinite(value):
            raise SampleError(f"{key} is not finite")
    else:
        raise SampleError(f"{key} is not a number")
    raise SampleError(f"{key}={value} is out of range")


def _text(raw: dict[str, Any], key: str, limit: int = 200) -> str:
    value = raw.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SampleError(f"{key} is not text")
    return value[:limit]


# A GPU entry's numbers: (agent key = ``GpuSample`` field, lowest, highest, whole number).
_GPU_NUMBERS: tuple[tuple[str, float, float, bool], ...] = (
    ("util_gpu", 0, 100, False),
    ("util_mem", 0, 100, False),
    ("mem_used_mib", 0, 1 << 24, False),
    ("mem_total_mib", 0, 1 << 24, False),
    ("temp_c", -50, 200, False),
    ("power_w", 0, 10_000, False),
    ("power_limit_w", 0, 10_000, False),
    ("sm_clock_mhz", 0, 10_000, False),
    ("mem_clock_mhz", 0, 50_000, False),
    ("pcie_tx_kbps", 0, 1 << 40, False),
    ("pcie_rx_kbps", 0, 1 << 40, False),
    ("ecc_corrected", 0, 1 << 63, True),
    ("ecc_uncorrected", 0, 1 << 63, True),
)


def parse_gpu(raw: Any) -> GpuSample:
    if not isinstance(raw, dict):
        raise SampleError("a GPU entry is not an object")
    index = _number(raw, "index", 0, MAX_GPUS_PER_NODE - 1, integer=True)
    if index is None:
        raise SampleError("a GPU entry has no index")
    state = raw.get("state", "ok")
    if state not in GPU_STATES:
        raise SampleError(f"unknown GPU state {state!r}")
    if state == "lost":
        return GpuSample(index=index, state="lost", error=_text(raw, "error"))
    throttle = raw.get("throttle") or []
    xid = raw.get("xid") or []
    if not isinstance(throttle, list) or not all(isinstance(t, str) for t in throttle):
        raise SampleError("throttle is not a list of names")
    if not isinstance(xid, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 16 for x in xid
    ):
        raise SampleError("xid is not a list of codes")
    # The relay checks 2,048 GPUs a second for a cluster, before its operators see them: the
    # common case (a number of the right type in range, or absent) inline, the rest (a float for
    # a whole number, or a refusal with its reason) through ``_number``.
    get = raw.get
    numbers: dict[str, Any] = {}
    for key, lo, hi, integer in _GPU_NUMBERS:
        value: Any = get(key)
        kind = type(value)
        if (kind is int or (kind is float and not integer)) and lo <= value <= hi:
            numbers[key] = value
        elif value is not None:
            numbers[key] = _number(raw, key, lo, hi, integer=integer)
    return GpuSample(
        index=index,
        uuid=_text(raw, "uuid", 80),
        name=_text(raw, "name", 80),
        throttle=tuple(t[:40] for t in throttle[:16]),
        xid=tuple(xid[:64]),
        **numbers,
    )


def parse_sample(raw: Any, *, simulated: bool = False) -> NodeSample:
    """A node sample from the agent's decoded JSON object (or the sim driver's dict)."""
    if not isinstance(raw, dict):
        raise SampleError("a sample is not an object")
    if raw.get("v") != SCHEMA_VERSION or raw.get("kind") != "sample":
        raise SampleError("not a version-1 sample")
    state = raw.get("state")
    if state not in NODE_STATES:
        raise SampleError(f"unknown node state {state!r}")
    ts = _number(raw, "ts", 0, 1e11)
    if ts is None:
        raise SampleError("a sample has no time")
    gpus_raw = raw.get("gpus") or []
    if not isinstance(gpus_raw, list) or len(gpus_raw) > MAX_GPUS_PER_NODE:
        raise SampleError("gpus is not a list of at most 64 entries")
    gpus = tuple(parse_gpu(g) for g in gpus_raw)
    if len({g.index for g in gpus}) != len(gpus):
        raise SampleError("a GPU index appears twice")
    return NodeSample(
        host=_text(raw, "host", 63),
        ts=float(ts),
        seq=_number(raw, "seq", 0, 1 << 62, integer=True) or 0,
        state=state,
        error=_text(raw, "error", 300),
        simulated=simulated or raw.get("simulated") is True,
        gpus=gpus,
    )


def parse_line(line: str | bytes) -> NodeSample:
    """One line the agent printed."""
    if len(line) > MAX_LINE_BYTES:
        raise SampleError("line too long")
    try:
        raw = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SampleError(f"not JSON: {exc}") from None
    return parse_sample(raw)


def _r(value: float | None, digits: int = 0) -> float | int | None:
    if value is None:
        return None
    return round(value) if digits == 0 else round(value, digits)


def gpu_row(rank: int, gpu: GpuSample) -> list[Any]:
    """One GPU in a ring entry / live message, in ``ROW_COLUMNS`` order."""
    if gpu.lost:
        return [rank, gpu.index, None, None, None, None, 0, 1]
    return [
        rank,
        gpu.index,
        _r(gpu.util_gpu),
        _r(gpu.mem_used_mib),
        _r(gpu.temp_c),
        _r(gpu.power_w, 1),
        len(gpu.xid),
        0,
    ]
