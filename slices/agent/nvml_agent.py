"""The node agent: samples every GPU with NVML once a second and prints one JSON line per sample.

Imports only the standard library and pynvml (package ``nvidia-ml-py``), so the ssh driver can copy
this one file to a node and run it there with the node's Python::

    python3 nvml_agent.py [--interval 1.0] [--count N] [--host NAME]

Each line is one sample of the whole node (schema ``v`` 1)::

    {"v": 1, "kind": "sample", "host": "...", "ts": 1733.0, "seq": 7, "state": "ok",
     "gpus": [{"index": 0, "uuid": "GPU-...", "name": "...", "state": "ok",
               "util_gpu": 97, "util_mem": 41, "mem_used_mib": 61234.0, "mem_total_mib": 81559.0,
               "temp_c": 66, "power_w": 612.3, "power_limit_w": 700.0,
               "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "pcie_tx_kbps": 1200, "pcie_rx_kbps": 800,
               "ecc_corrected": 0, "ecc_uncorrected": 0, "throttle": ["sw_power_cap"],
               "xid": [79]}]}

A field NVML does not support on that GPU is ``null``. Without NVML (no driver, no library: the
``NVMLError_LibraryNotFound`` case) every line says ``"state": "nvml_unavailable"`` with the reason,
and the agent keeps running and retries initialisation now and then, so a node whose driver comes
back is read again without a restart. A GPU that falls off the bus is reported with
``"state": "lost"`` and the others are still read.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

try:  # the agent must start even where the package is missing: that is "NVML unavailable" too
    import pynvml
except ImportError:  # pragma: no cover - the console's environment always has it
    pynvml = None

SCHEMA_VERSION = 1
STATE_OK = "ok"
STATE_UNAVAILABLE = "nvml_unavailable"
STATE_ERROR = "nvml_error"
GPU_OK = "ok"
GPU_LOST = "lost"
# Seconds between attempts to initialise NVML while it is unavailable.
RETRY_INIT_SECONDS = 30.0

# Clock-event ("throttle") reason bits, as NVML defines them (nvml.h nvmlClocksEventReason*).
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def throttle_names(mask: int | None) -> list[str] | None:
    """The names of the reasons set in an NVML clock-event bit mask (None when unknown)."""
    if mask is None:
        return None
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    if unknown:
        names.append(f"other_{unknown:#x}")
    return names


def mib(n_bytes: int | None) -> float | None:
    return None if n_bytes is None else round(n_bytes / (1024 * 1024), 1)


def watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else round(milliwatts / 1000.0, 1)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error_name(exc: BaseException) -> str:
    return type(exc).__name__.replace("NVMLError_", "") or "NVMLError"


class NvmlReader:
    """What NVML says about this node's GPUs; never raises NVML errors to the caller."""

    def __init__(self, nvml: Any = pynvml) -> None:
        self.nvml = nvml
        self.state = STATE_UNAVAILABLE
        self.error = "not initialised"
        self.count = 0
        self._handles: dict[int, Any] = {}
        self._events: Any = None
        self._next_init = 0.0

    # -- lifecycle ---------------------------------------------------------------------------
    def init(self, now: float) -> None:
        """(Re)initialise NVML if it is not up and the retry interval has passed."""
        if self.state == STATE_OK or now < self._next_init:
            return
        self._next_init = now + RETRY_INIT_SECONDS
        if self.nvml is None:
            self.state, self.error = STATE_UNAVAILABLE, "pynvml is not installed"
            return
        try:
            self.nvml.nvmlInit()
            self.count = int(self.nvml.nvmlDeviceGetCount())
        except self.nvml.NVMLError_LibraryNotFound as exc:
            self.state, self.error = STATE_UNAVAILABLE, f"LibraryNotFound: {exc}"
            return
        except self.nvml.NVMLError as exc:
            self.state, self.error = STATE_UNAVAILABLE, f"{_error_name(exc)}: {exc}"
            return
        self.state, self.error = STATE_OK, ""
        self._handles = {}
        self._events = self._register_xid_events()

    def shutdown(self) -> None:
        if self.state != STATE_OK:
            return
        try:
            if self._events is not None:
                self.nvml.nvmlEventSetFree(self._events)
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass
        self.state = STATE_UNAVAILABLE

    # -- reading -----------------------------------------------------------------------------
    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            self._handles[index] = handle
        return handle

    def _read(self, fn: Callable[[], Any]) -> Any:
        """One NVML field: None where unsupported; a lost GPU propagates (the caller reports it)."""
        nvml = self.nvml
        try:
            return fn()
        except (nvml.NVMLError_GpuIsLost, nvml.NVMLError_NotFound):
            raise
        except nvml.NVMLError:
            return None

    def _register_xid_events(self) -> Any:
        """An event set for critical Xid errors on every GPU that supports it (None otherwise)."""
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError:
            return None
        for index in range(self.count):
            try:
                nvml.nvmlDeviceRegisterEvents(
                    self._handle(index), nvml.nvmlEventTypeXidCriticalError, events
                )
            except nvml.NVMLError:
                continue  # not supported on this GPU (or lost): it simply reports no Xid
        return events

    def _drain_xids(self) -> dict[str, list[int]]:
        """Xid errors NVML reported since the last sample, by GPU UUID (non-blocking)."""
        nvml = self.nvml
        found: dict[str, list[int]] = {}
        if self._events is None:
            return found
        for _ in range(64):  # bounded: a storm of events must not stall the sampler
            try:
                data = nvml.nvmlEventSetWait(self._events, 0)
            except nvml.NVMLError:  # Timeout: nothing pending (or events unsupported)
                break
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            except nvml.NVMLError:
                uuid = "?"
            found.setdefault(uuid, []).append(int(data.eventData))
        return found

    def read_gpu(self, index: int) -> dict[str, Any]:
        nvml = self.nvml
        try:
            h = self._handle(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(h))
            util = self._read(lambda: nvml.nvmlDeviceGetUtilizationRates(h))
            mem = self._read(lambda: nvml.nvmlDeviceGetMemoryInfo(h))
            reasons = self._read(lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(h))
            if reasons is None:
                reasons = self._read(lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))
            return {
                "index": index,
                "uuid": uuid,
                "name": _text(self._read(lambda: nvml.nvmlDeviceGetName(h)) or ""),
                "state": GPU_OK,
                "util_gpu": None if util is None else int(util.gpu),
                "util_mem": None if util is None else int(util.memory),
                "mem_used_mib": None if mem is None else mib(mem.used),
                "mem_total_mib": None if mem is None else mib(mem.total),
                "temp_c": self._read(
                    lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
                ),
                "power_w": watts(self._read(lambda: nvml.nvmlDeviceGetPowerUsage(h))),
                "power_limit_w": watts(self._read(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))),
                "sm_clock_mhz": self._read(
                    lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)
                ),
                "mem_clock_mhz": self._read(
                    lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)
                ),
                "pcie_tx_kbps": self._read(
                    lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES)
                ),
                "pcie_rx_kbps": self._read(
                    lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES)
                ),
                "ecc_corrected": self._read(
                    lambda: nvml.nvmlDeviceGetTotalEccErrors(
                        h, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC
                    )
                ),
                "ecc_uncorrected": self._read(
                    lambda: nvml.nvmlDeviceGetTotalEccErrors(
                        h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                    )
                ),
                "throttle": throttle_names(reasons),
                "xid": [],
            }
        except nvml.NVMLError as exc:
            # Fallen off the bus (Xid 79), unplugged, or reset: report it and read the others.
            self._handles.pop(index, None)
            return {"index": index, "state": GPU_LOST, "error": f"{_error_name(exc)}: {exc}"}

    def sample(self, host: str, seq: int, now: float) -> dict[str, Any]:
        self.init(now)
        line: dict[str, Any] = {
            "v": SCHEMA_VERSION,
            "kind": "sample",
            "host": host,
            "ts": round(now, 3),
            "seq": seq,
            "state": self.state,
            "gpus": [],
        }
        if self.state != STATE_OK:
            line["error"] = self.error
            return line
        try:
            xids = self._drain_xids()
            gpus = [self.read_gpu(i) for i in range(self.count)]
        except Exception as exc:  # anything else from the library: say so, keep the agent alive
            line["state"], line["error"] = STATE_ERROR, f"{type(exc).__name__}: {exc}"
            return line
        for gpu in gpus:
            gpu_xids = xids.get(gpu.get("uuid", ""), [])
            if gpu.get("state") == GPU_OK:
                gpu["xid"] = gpu_xids
        line["gpus"] = gpus
        return line


def run(
    out: TextIO,
    *,
    interval: float = 1.0,
    count: int | None = None,
    host: str | None = None,
    reader: NvmlReader | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print ``count`` samples (forever when None), one per ``interval`` on a steady cadence."""
    reader = reader or NvmlReader()
    host = host or socket.gethostname()
    next_at = clock()
    try:
        for seq in _counter(count):
            line = reader.sample(host, seq, clock())
            try:
                out.write(json.dumps(line, separators=(",", ":")) + "\n")
                out.flush()
            except BrokenPipeError:
                return 0  # the relay went away: nothing left to report to
            next_at += interval
            delay = next_at - clock()
            if delay > 0:
                sleep(delay)
            else:
                next_at = clock()  # fell behind (a slow NVML call): skip, never burst
    except KeyboardInterrupt:
        return 0
    finally:
        reader.shutdown()
    return 0


def _counter(count: int | None) -> Iterator[int]:
    seq = 0
    while count is None or seq < count:
        yield seq
        seq += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Sample every GPU with NVML; one JSON line each.")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--count", type=int, default=None, help="stop after N samples")
    parser.add_argument("--host", default=None, help="the hostname to report (default: this one)")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error("--interval must be positive")
    return run(sys.stdout, interval=args.interval, count=args.count, host=args.host)


if __name__ == "__main__":
    sys.exit(main())
