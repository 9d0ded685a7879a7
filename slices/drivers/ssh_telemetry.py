"""GPU telemetry from real nodes: the node agent started over SSH, its stream read by the relay.

For each node of a running instance, ``SshAgentSource`` opens its own connection with the ssh
driver's pinned host key and the console's key, copies the agent (``slices/agent/nvml_agent.py``,
standard library + pynvml) to ``<workdir>/agent/`` with SFTP, runs it with the node's Python from a
fixed, quoted command template and reads one JSON line a second on a thread of its own. ``read``
hands the relay the newest line, never blocks, and says so (``nvml_error`` with the reason) while
the node cannot be reached; the thread reconnects with a back-off. ``close`` closes the channel:
the agent's next write fails with a broken pipe and it exits.

A node without NVML (no driver, or no pynvml in its Python: the SSH test hosts) reports
``nvml_unavailable`` through the agent itself, which is the honest answer there.
"""

from __future__ import annotations

import json
import logging
import posixpath
import threading
from pathlib import Path
from typing import Any

import paramiko

from slices.drivers.base import DriverError, InstanceSpec, NodeTarget
from slices.drivers.ssh import SshDriver, render

logger = logging.getLogger(__name__)

AGENT_SOURCE = Path(__file__).resolve().parent.parent / "agent" / "nvml_agent.py"
AGENT_COMMAND = "exec python3 -u {agent} --host {host} --interval {interval}"
MAX_LINE = 256 * 1024
BACKOFF_MAX = 30.0


class SshAgentSource:
    """One node's agent stream (a ``TelemetrySource``)."""

    simulated = False

    def __init__(
        self,
        driver: SshDriver,
        spec: InstanceSpec,
        node: NodeTarget,
        *,
        interval: float = 1.0,
    ) -> None:
        self.driver = driver
        self.node = node
        self.interval = interval
        self._latest: dict[str, Any] | None = None
        self._fresh = False
        self._problem = ""
        self._problem_reported_at = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._client: paramiko.SSHClient | None = None
        self._thread = threading.Thread(
            target=self._loop, name=f"agent-{node.hostname}", daemon=True
        )
        self._thread.start()

    # -- the relay's side ----------------------------------------------------------------------
    def read(self, now: float) -> dict[str, Any] | None:
        with self._lock:
            if self._fresh and self._latest is not None:
                self._fresh = False
                return self._latest
            problem = self._problem
            if problem and now - self._problem_reported_at >= 5 * self.interval:
                self._problem_reported_at = now
                return {
                    "v": 1,
                    "kind": "sample",
                    "host": self.node.hostname,
                    "ts": now,
                    "state": "nvml_error",
                    "error": f"agent: {problem}"[:300],
                    "gpus": [],
                }
        return None

    def close(self) -> None:
        self._stop.set()
        client = self._client
        if client is not None:
            client.close()  # ends the channel: the agent exits on its next write
        self._thread.join(timeout=10)

    # -- the reader thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                self._stream()
                backoff = 1.0
            except DriverError as exc:
                self._set_problem(f"{exc.code}: {exc.detail}")
            except (OSError, EOFError, paramiko.SSHException) as exc:
                self._set_problem(f"{type(exc).__name__}: {exc}")
            finally:
                if self._client is not None:
                    self._client.close()
                    self._client = None
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _set_problem(self, text: str) -> None:
        logger.info("telemetry agent on %s: %s", self.node.hostname, text)
        with self._lock:
            self._problem = text

    def _stream(self) -> None:
        # The driver's own connect: pinned host key (RejectPolicy), the console's key, timeouts.
        client = self.driver._connect(self.node)
        self._client = client
        if self._stop.is_set():
            return
        directory = posixpath.join(self.node.workdir, "agent")
        agent = posixpath.join(directory, "nvml_agent.py")
        self.driver.write_files(client, directory, [(agent, AGENT_SOURCE.read_text(), 0o600)])
        command = self.driver.host_command(
            render(AGENT_COMMAND, agent=agent, host=self.node.hostname, interval=str(self.interval))
        )
        transport = client.get_transport()
        if transport is None:
            raise DriverError("unreachable", "no SSH transport")
        channel = transport.open_session(timeout=self.driver.settings.connect_timeout)
        channel.settimeout(max(10.0, self.interval * 10))  # a silent agent is a dead agent
        channel.exec_command(command)
        with self._lock:
            self._problem = ""
        buffer = b""
        while not self._stop.is_set():
            data = channel.recv(65536)
            if not data:
                status = channel.recv_exit_status() if channel.exit_status_ready() else None
                error = channel.recv_stderr(4096).decode(errors="replace").strip()
                raise DriverError("agent_exited", f"exit {status}: {error[-200:]}")
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                self._take(line)
            if len(buffer) > MAX_LINE:
                buffer = b""  # a runaway line: drop it, keep reading

    def _take(self, line: bytes) -> None:
        try:
            sample = json.loads(line)
        except ValueError:
            return  # the relay validates samples; this only keeps whole JSON objects
        if isinstance(sample, dict):
            with self._lock:
                self._latest = sample
                self._fresh = True
