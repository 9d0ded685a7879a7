"""Telemetry from a real node: the agent copied over SFTP and started over SSH on an sshd test host
(Debian's OpenSSH on a loopback port, pinned host key), its stream read by the relay's source.

There is no GPU (and no pynvml in the node's system Python) here, so the agent honestly reports
NVML as unavailable, a line a second, and the source hands the newest line to the relay.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from slices.drivers.ssh import SshDriver
from slices.drivers.ssh_telemetry import SshAgentSource
from slices.telemetry.samples import parse_sample
from tests.slices.test_ssh_driver import make_driver, make_node, make_spec
from tests.support.sshd import SshHostPool, ssh_hosts  # noqa: F401


def _driver(pool: SshHostPool, tmp_path: Path) -> SshDriver:
    return make_driver(pool, {"pfs": tmp_path, "assets": tmp_path})


def _first_sample(source: SshAgentSource, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sample = source.read(time.time())
        if sample is not None:
            return sample
        time.sleep(0.1)
    raise AssertionError("no sample from the agent")


def test_agent_over_ssh_streams_nvml_unavailable_lines(
    ssh_hosts: SshHostPool,  # noqa: F811
    tmp_path: Path,
) -> None:
    host = ssh_hosts.get(1)[0]
    node = make_node(host, host.node_dir)
    source = SshAgentSource(_driver(ssh_hosts, tmp_path), make_spec((node,)), node, interval=0.2)
    try:
        first = parse_sample(_first_sample(source))
        assert first.host == node.hostname and first.state == "nvml_unavailable"
        assert first.error  # why: no NVML library, or no pynvml in the node's Python
        second = parse_sample(_first_sample(source))
        assert second.seq > first.seq  # a stream, not one line
        assert (host.node_dir / "agent" / "nvml_agent.py").exists()
    finally:
        source.close()
    # Closing the channel ends the agent on the node (its next write hits a broken pipe).
    agent = str(host.node_dir / "agent" / "nvml_agent.py")
    deadline = time.monotonic() + 30
    while subprocess.run(["pgrep", "-f", agent], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the agent kept running after the relay let go"
        time.sleep(0.2)


def test_a_node_with_another_host_key_reports_the_problem_and_runs_nothing(
    ssh_hosts: SshHostPool,  # noqa: F811
    tmp_path: Path,
) -> None:
    host = ssh_hosts.get(1)[0]
    wrong = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x"
    node = make_node(host, tmp_path / "node", host_key=wrong)
    source = SshAgentSource(_driver(ssh_hosts, tmp_path), make_spec((node,)), node, interval=0.2)
    try:
        sample = parse_sample(_first_sample(source))
        assert sample.state == "nvml_error" and "host_key_mismatch" in sample.error
        assert not (tmp_path / "node" / "agent").exists()  # refused before anything was copied
    finally:
        source.close()
