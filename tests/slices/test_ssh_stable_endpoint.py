"""One SSH address for an instance's whole life (issue 29), on real sshd test hosts with the real
OpenSSH client and the gateway's real forwarder (``slices/agent/gateway_forward.py``).

Xiamen's gateway forwards ports (``Gateway.ports``): the instance gets one of them at its first
start and the page shows ``ssh -p <port> root@<gateway>``. The customer saves that in a
``~/.ssh/config`` once; it keeps working after a stop and a start on the other host, and after the
host fails and the instance is migrated: the console rewrites the gateway's routes file, the
forwarder sends the same port to wherever the instance's sshd runs now, with the host key the
console made for the instance (``Instance.ssh_host_key``), so the key Alice pinned stays valid on
a fresh node. Every host key is pinned (``StrictHostKeyChecking yes``). Released, the port answers
nothing and is free again.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from billing import services as billing
from console import services as console_services
from console.models import User
from slices import services
from slices.choices import InstanceState
from slices.models import Gateway, Instance, Node, Region
from slices.services import access, migration, power
from tests.slices.factories import load_small_fleet, run_order
from tests.support.sshd import (  # noqa: F401
    SshFleet,
    SshGateway,
    SshHostPool,
    configure_ssh_fleet,
    configure_ssh_gateway,
    generate_key,
    ssh_hosts,
    start_gateway,
)

pytestmark = pytest.mark.django_db
SSH = "/usr/bin/ssh"
FORWARDER = Path(__file__).resolve().parents[2] / "slices" / "agent" / "gateway_forward.py"


def _free_range(size: int = 8) -> tuple[int, int]:
    """``size`` consecutive loopback ports nothing listens on now."""
    for low in range(47000, 60000, size):
        socks = []
        try:
            for port in range(low, low + size):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return low, low + size - 1
    raise AssertionError("no free port range")


@pytest.fixture(scope="module")
def gateway(ssh_hosts: SshHostPool) -> Iterator[SshGateway]:  # noqa: F811
    gw = start_gateway(ssh_hosts, "gateway-stable")
    yield gw
    gw.stop()


@pytest.fixture
def forwarder(gateway: SshGateway) -> Iterator[Path]:
    """The gateway's forwarder on the loopback, reading the routes file beside the keys file."""
    routes = gateway.keys_file.parent / "routes"
    routes.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, str(FORWARDER), "--routes", str(routes), "--bind", "127.0.0.1"]
        + ["--interval", "0.05"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield routes
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def fleet(settings, ssh_hosts: SshHostPool, gateway: SshGateway, tmp_path: Path) -> SshFleet:  # noqa: ANN001, F811
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SSH_CONNECT_TIMEOUT = 5.0
    settings.SLICES_SSH_COMMAND_TIMEOUT = 30.0
    load_small_fleet()
    nodes = list(Node.objects.filter(cluster__code="xm-4090").order_by("hostname"))
    fleet = configure_ssh_fleet(
        settings, ssh_hosts.get(2), nodes, tmp_path, client_key=ssh_hosts.client_key
    )
    row = configure_ssh_gateway(gateway, Region.objects.get(code="xiamen"))
    low, high = _free_range()
    Gateway.objects.filter(pk=row.pk).update(ports=f"{low}-{high}")
    return fleet


class Customer:
    """Alice's laptop: her key, a known_hosts file that pins, and the ~/.ssh/config she saves."""

    def __init__(self, user: User, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.key = directory / "id_ed25519"
        self.public = generate_key(self.key, f"{user.username}@laptop")
        self.known_hosts = directory / "known_hosts"
        self.known_hosts.write_text("")
        self.config = directory / "ssh_config"
        self.config.write_text(
            "Host *\n"
            f"    IdentityFile {self.key}\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {self.known_hosts}\n"
            "    StrictHostKeyChecking yes\n"
            "    BatchMode yes\n"
            "    ConnectTimeout 10\n"
            "    LogLevel ERROR\n"
        )

    def pin(self, port: int, host_key_line: str) -> None:
        with self.known_hosts.open("a") as f:
            f.write(f"[127.0.0.1]:{port} {' '.join(host_key_line.split()[:2])}\n")

    def ssh(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SSH, "-F", str(self.config), *args],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    def until(self, *args: str, seconds: float = 15.0) -> subprocess.CompletedProcess[str]:
        """The forwarder reads the routes file a few times a second: try until it answers."""
        deadline = time.monotonic() + seconds
        while True:
            done = self.ssh(*args)
            if done.returncode == 0 or time.monotonic() > deadline:
                return done
            time.sleep(0.1)


def _host_key(fleet: SshFleet, inst: Instance) -> str:
    part = inst.nodes.select_related("node").get()
    root = fleet.workdirs[part.node.hostname] / "instances" / inst.slug
    return (root / "ssh_host_ed25519_key.pub").read_text()


def test_one_address_from_the_first_start_to_the_release_through_stop_start_and_migration(
    fleet: SshFleet,
    gateway: SshGateway,
    forwarder: Path,
    alice: User,
    tmp_path: Path,
    django_capture_on_commit_callbacks,
) -> None:
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    a = Customer(alice, tmp_path / "alice")
    console_services.add_ssh_key(alice, name="laptop", public_key=a.public)
    inst = run_order(alice, django_capture_on_commit_callbacks, cards=8, name="box")
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "text"))

    # The page's endpoint: the instance's own port on the gateway, no jump.
    port = inst.gateway_port
    low, high = Gateway.objects.get(region=inst.region).port_range()
    assert port is not None and low <= port <= high
    shown = access.ssh_access(inst)
    assert shown is not None and not shown.jump
    command = f"ssh -p {port} root@127.0.0.1"
    assert shown.command == command
    config_block = shown.ssh_config
    assert f"Port {port}" in config_block and "ProxyJump" not in config_block
    # The routes file the console wrote beside the keys file: the port to the node's sshd now.
    part = inst.nodes.get()
    assert f"{port} 127.0.0.1 {part.ssh_port} {inst.slug}" in forwarder.read_text()

    # Alice saves the config block once and pins the instance's host key.
    pinned = _host_key(fleet, inst)
    a.pin(port, pinned)
    with a.config.open("a") as f:
        f.write("\n" + config_block)
    done = a.until(shown.alias, "echo first && id -u")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["first", "0"]
    assert a.ssh(*command.split()[1:], "echo as-shown").stdout.strip() == "as-shown"

    # Stopped: the port answers nothing; started again on the other host: the same address.
    first = inst.nodes.select_related("node").get().node
    with django_capture_on_commit_callbacks(execute=True):
        power.stop_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.STOPPED and inst.gateway_port == port
    assert f"{port} " not in forwarder.read_text()
    services.change_node_state(first, "drain", "disk swap")
    with django_capture_on_commit_callbacks(execute=True):
        result = power.start_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "text"))
    assert result.moved_from == first.hostname
    second = inst.nodes.select_related("node").get()
    assert second.node_id != first.id
    assert inst.gateway_port == port
    assert access.ssh_access(inst).command == command
    assert access.ssh_access(inst).ssh_config == config_block
    assert f"{port} 127.0.0.1 {second.ssh_port} {inst.slug}" in forwarder.read_text()
    done = a.until(shown.alias, "echo after-start")  # the saved config, unchanged
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "after-start"

    # The host fails: the instance is migrated back to the first host, which has nothing of it
    # left (a fresh node): the address and the host key Alice pinned stay.
    services.change_node_state(first, "return", "swapped")
    shutil.rmtree(fleet.workdirs[first.hostname] / "instances" / inst.slug, ignore_errors=True)
    with django_capture_on_commit_callbacks(execute=True):
        assert migration.fail_node(second.node, "test", "host taken away")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "text"))
    third = inst.nodes.select_related("node").get()
    assert third.node_id == first.id
    assert inst.gateway_port == port
    assert access.ssh_access(inst).command == command
    assert f"{port} 127.0.0.1 {third.ssh_port} {inst.slug}" in forwarder.read_text()
    assert _host_key(fleet, inst) == pinned  # the console's key for the instance, not a new one
    done = a.until(shown.alias, "echo after-migration")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "after-migration"

    # Released: the port leaves the routes, answers nothing, and is free for the next instance.
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RELEASED and inst.gateway_port is None
    assert f"{port} " not in forwarder.read_text()
    time.sleep(0.5)  # the forwarder's next look
    gone = a.ssh(shown.alias, "true")
    assert gone.returncode == 255
