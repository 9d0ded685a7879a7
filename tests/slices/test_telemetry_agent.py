"""The node agent: runs alone (standard library + pynvml), says "NVML unavailable" honestly here
(no GPU, no driver: the real pynvml import and the real NVMLError_LibraryNotFound), keeps running,
and its lines parse; a lost GPU is reported, not fatal; bad lines are refused."""

from __future__ import annotations

import ast
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from slices.agent import nvml_agent
from slices.agent.nvml_agent import NvmlReader, run, throttle_names
from slices.telemetry.samples import SampleError, gpu_row, parse_line

AGENT = Path(nvml_agent.__file__)


def _copy_alone(tmp_path: Path) -> Path:
    """The agent as the ssh driver ships it: one file, no package around it."""
    target = tmp_path / "node" / "nvml_agent.py"
    target.parent.mkdir()
    shutil.copy(AGENT, target)
    return target


def test_agent_imports_only_the_standard_library_and_pynvml() -> None:
    tree = ast.parse(AGENT.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    outside = {m for m in imported if m not in sys.stdlib_module_names} - {"__future__"}
    assert outside == {"pynvml"}


def test_agent_copied_alone_reports_nvml_unavailable_and_stops_after_count(
    tmp_path: Path,
) -> None:
    agent = _copy_alone(tmp_path)
    result = subprocess.run(
        [sys.executable, str(agent), "--count", "3", "--interval", "0.05", "--host", "gpu-n1"],
        cwd=agent.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    samples = [parse_line(line) for line in lines]
    assert [s.seq for s in samples] == [0, 1, 2]
    assert {s.state for s in samples} == {"nvml_unavailable"}
    assert all("LibraryNotFound" in s.error for s in samples)
    assert all(s.host == "gpu-n1" and s.gpus == () for s in samples)
    assert samples[0].ts <= samples[1].ts <= samples[2].ts


def test_agent_keeps_emitting_lines_without_nvml_until_stopped(tmp_path: Path) -> None:
    agent = _copy_alone(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-u", str(agent), "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(8)]
        assert proc.poll() is None, "the agent exited although NVML is merely unavailable"
        parsed = [parse_line(line) for line in lines]
        assert [p.seq for p in parsed] == list(range(8))
        assert all(p.state == "nvml_unavailable" for p in parsed)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_reader_with_the_real_pynvml_retries_init_on_its_interval() -> None:
    reader = NvmlReader()  # the real pynvml module, no GPU library on this machine
    first = reader.sample("h", 0, 1000.0)
    assert first["state"] == "nvml_unavailable"
    assert first["error"].startswith("LibraryNotFound")
    # Not retried before the interval, retried after it (and still unavailable, still no raise).
    assert reader._next_init == 1000.0 + nvml_agent.RETRY_INIT_SECONDS
    reader.sample("h", 1, 1001.0)
    assert reader._next_init == 1000.0 + nvml_agent.RETRY_INIT_SECONDS
    again = reader.sample("h", 2, 1000.0 + nvml_agent.RETRY_INIT_SECONDS + 1)
    assert again["state"] == "nvml_unavailable"
    assert reader._next_init > 1000.0 + nvml_agent.RETRY_INIT_SECONDS


def test_run_writes_one_line_per_tick_on_a_steady_cadence() -> None:
    out = io.StringIO()
    t = [100.0]
    sleeps: list[float] = []

    def clock() -> float:
        return t[0]

    def sleep(s: float) -> None:
        sleeps.append(s)
        t[0] += s

    run(out, interval=1.0, count=4, host="n", clock=clock, sleep=sleep)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [x["ts"] for x in lines] == [100.0, 101.0, 102.0, 103.0]
    assert sleeps == [1.0, 1.0, 1.0, 1.0]


class _StandInNvml:
    """A stand-in for libnvidia-ml with two GPUs, the second of which falls off the bus.

    There is no GPU here; the real pynvml module provides the error classes and constants, so the
    agent's handling of what NVML raises is exercised as on a node. One Xid 79 is pending.
    """

    def __init__(self) -> None:
        self.lost = False
        self.events = [SimpleNamespace(device="h0", eventData=13)]

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)  # error classes and constants

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        pass

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:  # noqa: N802
        return f"h{i}"

    def _check(self, h: str) -> None:
        if h == "h1" and self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def nvmlDeviceGetUUID(self, h: str) -> str:  # noqa: N802
        self._check(h)
        return f"GPU-{h}"

    def nvmlDeviceGetName(self, h: str) -> bytes:  # noqa: N802
        return b"NVIDIA H800"

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:  # noqa: N802
        self._check(h)
        return SimpleNamespace(gpu=97, memory=41)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:  # noqa: N802
        return SimpleNamespace(used=60 * 1024**3, total=80 * 1024**3)

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:  # noqa: N802
        return 66

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:  # noqa: N802
        return 612_345

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:  # noqa: N802
        return 700_000

    def nvmlDeviceGetClockInfo(self, h: str, clock: int) -> int:  # noqa: N802
        return 1980 if clock == pynvml.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetPcieThroughput(self, h: str, counter: int) -> int:  # noqa: N802
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetTotalEccErrors(self, h: str, kind: int, counter: int) -> int:  # noqa: N802
        return 0 if kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 2

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:  # noqa: N802
        return 0x4 | 0x40

    def nvmlEventSetCreate(self) -> str:  # noqa: N802
        return "events"

    def nvmlDeviceRegisterEvents(self, h: str, kinds: int, events: str) -> None:  # noqa: N802
        if h == "h1":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetWait(self, events: str, timeout_ms: int) -> Any:  # noqa: N802
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.pop()

    def nvmlEventSetFree(self, events: str) -> None:  # noqa: N802
        pass


def test_reader_reads_every_field_and_reports_a_lost_gpu_without_stopping() -> None:
    nvml = _StandInNvml()
    reader = NvmlReader(nvml)
    first = parse_line(json.dumps(reader.sample("gpu-n1", 0, 10.0)))
    assert first.state == "ok"
    g0, g1 = first.gpus
    assert (g0.util_gpu, g0.util_mem, g0.temp_c) == (97, 41, 66)
    assert (g0.mem_used_mib, g0.mem_total_mib) == (61440.0, 81920.0)
    assert (g0.power_w, g0.power_limit_w) == (612.3, 700.0)
    assert (g0.sm_clock_mhz, g0.mem_clock_mhz) == (1980, 2619)
    assert g0.pcie_tx_kbps is None  # not supported on this GPU: null, not an error
    assert (g0.ecc_corrected, g0.ecc_uncorrected) == (0, 2)
    assert g0.throttle == ("sw_power_cap", "hw_thermal_slowdown")
    assert g0.xid == (13,) and g1.xid == ()
    nvml.lost = True
    second = parse_line(json.dumps(reader.sample("gpu-n1", 1, 11.0)))
    assert second.state == "ok"
    assert second.gpus[0].util_gpu == 97
    assert second.gpus[1].lost and "GpuIsLost" in second.gpus[1].error
    assert gpu_row(3, second.gpus[1]) == [3, 1, None, None, None, None, 0, 1]


def test_throttle_names_include_unknown_bits() -> None:
    assert throttle_names(0) == []
    assert throttle_names(None) is None
    assert throttle_names(0x1 | 0x8) == ["gpu_idle", "hw_slowdown"]
    assert throttle_names(0x1000) == ["other_0x1000"]


GOOD = {
    "v": 1,
    "kind": "sample",
    "host": "gpu-n1",
    "ts": 1_700_000_000.5,
    "seq": 4,
    "state": "ok",
    "gpus": [{"index": 0, "uuid": "GPU-1", "util_gpu": 50, "temp_c": 60, "xid": [79]}],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"v": 2}, "version-1"),
        ({"state": "exploded"}, "node state"),
        ({"ts": None}, "no time"),
        ({"gpus": [{"index": 0, "util_gpu": 150}]}, "out of range"),
        ({"gpus": [{"index": 0, "util_gpu": True}]}, "not a number"),
        ({"gpus": [{"index": 0, "temp_c": "hot"}]}, "not a number"),
        ({"gpus": [{"index": 0}, {"index": 0}]}, "twice"),
        ({"gpus": [{"index": i} for i in range(65)]}, "at most 64"),
        ({"gpus": [{"index": 0, "xid": ["79"]}]}, "xid"),
        ({"gpus": [{"index": 0, "state": "melted"}]}, "GPU state"),
    ],
)
def test_parse_line_refuses_bad_samples(change: dict[str, Any], message: str) -> None:
    with pytest.raises(SampleError, match=message):
        parse_line(json.dumps({**GOOD, **change}))


def test_parse_line_refuses_garbage_and_non_finite_numbers() -> None:
    with pytest.raises(SampleError, match="not JSON"):
        parse_line("{nope")
    with pytest.raises(SampleError, match="not finite"):
        parse_line(json.dumps({**GOOD, "gpus": [{"index": 0, "power_w": float("nan")}]}))
    with pytest.raises(SampleError, match="too long"):
        parse_line("x" * (256 * 1024 + 1))


def test_parse_line_accepts_a_good_sample() -> None:
    sample = parse_line(json.dumps(GOOD))
    assert sample.host == "gpu-n1" and sample.seq == 4 and not sample.simulated
    assert sample.gpus[0].xid == (79,)
    assert gpu_row(0, sample.gpus[0]) == [0, 0, 50, None, 60, None, 1, 0]


def test_module_entry_point_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "slices.agent", "--count", "1", "--interval", "0.01"],
        cwd=AGENT.parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert parse_line(result.stdout.strip()).state == "nvml_unavailable"
