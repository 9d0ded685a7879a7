"""SSH that works as shown (issue 19), on real sshd test hosts with the real OpenSSH client.

The small fleet's two RTX 4090 hosts are two test hosts; Xiamen's gateway is a third sshd whose
jump user's keys file the console writes. Each customer's key goes ``-J`` through the gateway to
the instance's own sshd (a daemon the driver started for the instance, on its port of the node)
and runs a command; the gateway lets a key through to its owner's instances only, gives it no
shell, drops it at release, and never carries the console's own key. Every host key is pinned
(``StrictHostKeyChecking=yes`` against a known_hosts file the test writes).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from billing import services as billing
from console import services as console_services
from console.models import User
from slices import services
from slices.choices import InstanceState
from slices.models import Instance, InstanceNode, Node, Region
from slices.services import access, power
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


@pytest.fixture(scope="module")
def gateway(ssh_hosts: SshHostPool) -> Iterator[SshGateway]:  # noqa: F811
    gw = start_gateway(ssh_hosts, "gateway-xiamen")
    yield gw
    gw.stop()


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
    configure_ssh_gateway(gateway, Region.objects.get(code="xiamen"))
    return fleet


class Customer:
    """An account with its own key pair and an ssh client config that pins every host key."""

    def __init__(self, user: User, directory: Path, key_line: str | None = None) -> None:
        self.user = user
        directory.mkdir(parents=True, exist_ok=True)
        self.key = directory / "id_ed25519"
        self.public = key_line or generate_key(self.key, f"{user.username}@laptop")
        self.known_hosts = directory / "known_hosts"
        self.known_hosts.write_text("")
        self.config = directory / "ssh_config"
        # Options given on the command line apply to the destination only, not to the jump:
        # the config file (passed on to the jump's ssh with -F) holds them for both.
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


def _customer(user: User, tmp_path: Path, gateway: SshGateway) -> Customer:
    billing.grant_voucher(user, Decimal("5000"), reason="test", valid_days=30)
    c = Customer(user, tmp_path / user.username)
    console_services.add_ssh_key(user, name="laptop", public_key=c.public)
    c.pin(gateway.host.port, gateway.host.host_key_line)
    return c


def _order(user: User, capture) -> Instance:  # noqa: ANN001
    """An 8-card box: one whole RTX 4090 host of the two."""
    inst = run_order(user, capture, cards=8, name="box")
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "text"))
    return inst


def _endpoint(fleet: SshFleet, c: Customer, inst: Instance) -> tuple[Instance, str]:
    """The instance as the page shows it, with its sshd's host key pinned for ``c``."""
    part = inst.nodes.select_related("node").get()
    root = fleet.workdirs[part.node.hostname] / "instances" / inst.slug
    c.pin(int(part.ssh_port), (root / "ssh_host_ed25519_key.pub").read_text())
    return inst, str(root)


def _run_as_shown(c: Customer, inst: Instance, command: str) -> subprocess.CompletedProcess[str]:
    """The page's command, verbatim, with a command to run at the end."""
    shown = access.ssh_access(inst)
    assert shown is not None
    argv = shown.command.split()
    assert argv[0] == "ssh"
    return c.ssh(*argv[1:], command)


def test_the_shown_command_reaches_the_instance_through_the_gateway_and_only_its_owners(
    fleet: SshFleet,
    gateway: SshGateway,
    ssh_hosts: SshHostPool,  # noqa: F811
    alice: User,
    bob: User,
    tmp_path: Path,
    django_capture_on_commit_callbacks,
) -> None:
    a = _customer(alice, tmp_path, gateway)
    b = _customer(bob, tmp_path, gateway)
    mine, my_root = _endpoint(fleet, a, _order(alice, django_capture_on_commit_callbacks))
    theirs, _ = _endpoint(fleet, b, _order(bob, django_capture_on_commit_callbacks))
    assert mine.nodes.get().node_id != theirs.nodes.get().node_id

    # The page's endpoint: the instance's own sshd on its node, through the region's gateway.
    shown = access.ssh_access(mine)
    assert shown is not None
    part = mine.nodes.get()
    assert (shown.host, shown.port, shown.user) == ("127.0.0.1", part.ssh_port, "root")
    assert shown.command == (
        f"ssh -J nobody@127.0.0.1:{gateway.host.port} root@127.0.0.1 -p {part.ssh_port}"
    )
    low, high = access.port_range()
    assert low <= part.ssh_port <= high

    # The keys file: one line per key, each restricted to its owner's endpoint, no shell.
    keys = gateway.keys_text()
    lines = [ln for ln in keys.splitlines() if ln and not ln.startswith("#")]
    assert len(lines) == 2
    mine_line = next(ln for ln in lines if a.public.split()[1] in ln)
    assert mine_line.startswith(
        f'restrict,port-forwarding,permitopen="127.0.0.1:{part.ssh_port}",command="/bin/false" '
    )
    assert "alice@laptop" not in keys  # rebuilt from type and base64, not the pasted line
    assert ssh_hosts.client_public.split()[1] not in keys  # the console's key: never

    # Alice's key, the real client, the command as shown: it runs in her instance.
    done = _run_as_shown(a, mine, "echo hello from $(hostname) && id -u")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "0"
    assert "hello from" in done.stdout
    assert "Accepted publickey for root" in Path(my_root, "sshd.log").read_text()
    # And the ~/.ssh/config block as VS Code Remote-SSH would use it.
    config = tmp_path / "alice" / "ssh_config"
    config.write_text(config.read_text() + "\n" + shown.ssh_config.replace("Host ", "Host x-", 1))
    done = a.ssh(f"x-{shown.alias}", "echo via-config")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "via-config"

    # Bob's key through the gateway to Alice's instance: the gateway refuses the forward.
    refused = _run_as_shown(b, mine, "id -u")
    assert refused.returncode == 255
    assert "stdio forwarding failed" in refused.stderr, refused.stderr
    denied = f"to connect to host 127.0.0.1 port {part.ssh_port}, but the request was denied"
    assert denied in gateway.host.log_text()
    # Bob's own instance is his to reach.
    assert _run_as_shown(b, theirs, "true").returncode == 0

    # The gateway gives a customer key no shell and runs no command of theirs.
    at_gateway = a.ssh("-p", str(gateway.host.port), f"{gateway.user}@127.0.0.1", "echo pwned")
    assert at_gateway.returncode != 0 and "pwned" not in at_gateway.stdout
    tty = a.ssh("-tt", "-p", str(gateway.host.port), f"{gateway.user}@127.0.0.1")
    assert tty.returncode != 0

    # Released: Alice's key is gone from the gateway, refused there before anything else.
    with django_capture_on_commit_callbacks(execute=True):
        assert services.release_instance(mine, by="alice")
    mine.refresh_from_db()
    assert mine.state == InstanceState.RELEASED
    assert a.public.split()[1] not in gateway.keys_text()
    assert b.public.split()[1] in gateway.keys_text()
    assert not InstanceNode.objects.filter(instance=mine, ssh_port__isnull=False).exists()
    gone = a.ssh("-p", str(gateway.host.port), f"{gateway.user}@127.0.0.1", "true")
    assert gone.returncode == 255
    assert "Permission denied (publickey)" in gone.stderr
    # Bob still reaches his.
    assert _run_as_shown(b, theirs, "true").returncode == 0
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(theirs, by="bob")
    assert "permitopen" not in gateway.keys_text()


def test_the_console_key_is_never_let_through_even_when_a_customer_registers_it(
    fleet: SshFleet,
    gateway: SshGateway,
    ssh_hosts: SshHostPool,  # noqa: F811
    alice: User,
    tmp_path: Path,
    django_capture_on_commit_callbacks,
) -> None:
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    console_services.add_ssh_key(alice, name="console's", public_key=ssh_hosts.client_public)
    inst = _order(alice, django_capture_on_commit_callbacks)
    assert access.gateway_grants(inst.region.gateway)  # the database would let it through...
    assert ssh_hosts.client_public.split()[1] not in gateway.keys_text()  # ...the driver never
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(inst, by="alice")


def _rsa_customer(user: User, tmp_path: Path, gateway: SshGateway) -> Customer:
    directory = tmp_path / user.username
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / "id_ed25519"  # the name Customer's config points at; an RSA key in it
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-C", "x", "-f", str(key)],
        check=True,
    )
    c = Customer(user, directory, key_line=Path(f"{key}.pub").read_text().strip())
    c.pin(gateway.host.port, gateway.host.host_key_line)
    return c


def test_a_re_encoded_key_never_takes_its_owners_connections_and_a_deleted_key_stops_working(
    fleet: SshFleet,
    gateway: SshGateway,
    alice: User,
    bob: User,
    tmp_path: Path,
    django_capture_on_commit_callbacks,
) -> None:
    """Issue 29: Bob pastes Alice's public RSA key with a zero byte before its modulus. To sshd it
    is her key; stored as a second key it became a keys-file line sorted before hers that took her
    connections to Bob's instance. Now it is refused as in use, and an instance that holds such an
    encoding (from before the fix) is let through for nobody but the key's registered owner."""
    from django.core.exceptions import ValidationError

    from tests.console.factories import padded_rsa_key

    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    a = _rsa_customer(alice, tmp_path, gateway)
    console_services.add_ssh_key(alice, name="rsa", public_key=a.public)
    padded = padded_rsa_key(a.public)
    with pytest.raises(ValidationError) as refused:
        console_services.add_ssh_key(bob, name="mine", public_key=padded)
    assert refused.value.error_dict["public_key"][0].code == "in_use"

    mine, _ = _endpoint(fleet, a, _order(alice, django_capture_on_commit_callbacks))
    b = _customer(bob, tmp_path, gateway)
    theirs, _ = _endpoint(fleet, b, _order(bob, django_capture_on_commit_callbacks))
    # An instance ordered before the fix carries the padded encoding as its key.
    Instance.objects.filter(pk=theirs.pk).update(ssh_public_key=" ".join(padded.split()[:2]))
    access.sync_region(mine.region_id)
    keys = gateway.keys_text()
    assert padded.split()[1] not in keys
    assert keys.count(a.public.split()[1]) == 1
    part = mine.nodes.get()
    line = next(ln for ln in keys.splitlines() if a.public.split()[1] in ln)
    assert f'permitopen="127.0.0.1:{part.ssh_port}"' in line
    assert f"gpc:{alice.public_id}" in line
    done = _run_as_shown(a, mine, "echo still-mine")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "still-mine"

    # Alice deletes the key from her account: the gateway drops it at once (a sync is queued
    # on commit), while the instance keeps running.
    key = console_services.get_default_ssh_key(alice)
    assert key is not None
    with django_capture_on_commit_callbacks(execute=True):
        assert console_services.delete_ssh_key(alice, key)
    assert a.public.split()[1] not in gateway.keys_text()
    mine.refresh_from_db()
    assert mine.state == InstanceState.RUNNING
    gone = _run_as_shown(a, mine, "true")
    assert gone.returncode == 255
    assert "Permission denied (publickey)" in gone.stderr, gone.stderr
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(mine, by="alice")
        services.release_instance(theirs, by="bob")


def test_a_stopped_instance_loses_its_endpoint_and_a_restart_elsewhere_gets_a_new_one(
    fleet: SshFleet,
    gateway: SshGateway,
    alice: User,
    tmp_path: Path,
    django_capture_on_commit_callbacks,
) -> None:
    a = _customer(alice, tmp_path, gateway)
    inst, _root = _endpoint(fleet, a, _order(alice, django_capture_on_commit_callbacks))
    first = inst.nodes.select_related("node").get()
    assert _run_as_shown(a, inst, "true").returncode == 0
    with django_capture_on_commit_callbacks(execute=True):
        power.stop_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.STOPPED
    assert "permitopen" not in gateway.keys_text()
    assert InstanceNode.objects.get(pk=first.pk).ssh_port is None
    # The old sshd is gone with the instance: nothing answers on its port for Alice.
    services.change_node_state(first.node, "drain", "disk swap")
    with django_capture_on_commit_callbacks(execute=True):
        result = power.start_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "text"))
    assert result.moved_from == first.node.hostname
    moved = inst.nodes.select_related("node").get()
    assert moved.node_id != first.node_id and moved.ssh_port is not None
    assert (inst.ssh_host, inst.ssh_port) == (moved.node.address, moved.ssh_port)
    assert f'permitopen="127.0.0.1:{moved.ssh_port}"' in gateway.keys_text()
    _endpoint(fleet, a, inst)  # the host key moved with the system disk
    done = _run_as_shown(a, inst, "echo moved")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "moved"
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(inst, by="alice")


# -- docker: the image's sshd, started with ``docker exec`` (a recording fake docker) -----------
FAKE_DOCKER = """#!/bin/sh
printf '%s\\0' "$@" >> {log}; printf '\\n' >> {log}
case "$1" in
  container|image) exit 1;;
  exec) [ "$3" = /bin/sh ] && echo "sshd started"; exit 0;;
  *) exit 0;;
esac
"""


def _docker_calls(log: Path) -> list[list[str]]:
    """Each call's arguments (NUL-terminated, a line break after each call)."""
    records = log.read_text().split("\0\n") if log.exists() else []
    return [record.split("\0") for record in records if record]


@pytest.mark.parametrize("exclusive", [True, False], ids=["whole-node", "shared-node"])
def test_a_docker_instance_gets_the_images_sshd_on_its_port(
    ssh_hosts: SshHostPool,  # noqa: F811
    tmp_path: Path,
    exclusive: bool,
) -> None:
    from slices.drivers.base import InstanceSpec, NodeTarget
    from slices.drivers.ssh import SshDriver, SshSettings

    host = ssh_hosts.get(1)[0]
    log = tmp_path / "docker.calls"
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER.format(log=log))
    docker.chmod(0o755)
    (tmp_path / "pfs" / "owner-1").mkdir(parents=True)
    driver = SshDriver(
        SshSettings(
            key_file=str(ssh_hosts.client_key),
            pfs_root=str(tmp_path / "pfs"),
            asset_root=str(tmp_path / "assets"),
            connect_timeout=5.0,
            command_timeout=30.0,
            docker_bin=str(docker),
        )
    )
    node = NodeTarget(
        hostname="n1",
        address=host.address,
        port=host.port,
        host_key=host.host_key_line,
        rank=0,
        gpus=tuple(range(8)) if exclusive else (3,),
        workdir=str(tmp_path / "node"),
        runtime="docker",
        node_gpus=8,
        instance_ssh_port=30123,
    )
    spec = InstanceSpec(
        instance_id="6f1c7a52-0000-4000-8000-000000000002",
        slug="gpc-6f1c7a52",
        name="box",
        owner="owner-1",
        image="registry.example.com/pytorch:2.3",
        entrypoint="",
        env={},
        mounts=(),
        ssh_public_key="",
        nodes=(node,),
        gpus_per_node=len(node.gpus),
    )
    logs: list[str] = []
    driver.prepare(spec, node, logs.append)
    result = driver.start(spec, node, logs.append)
    assert result.data["sshd"] is True and result.data["ssh_port"] == 30123
    calls = _docker_calls(log)
    run = next(c for c in calls if c[:1] == ["run"])
    sshd = next(c for c in calls if c[:1] == ["exec"])
    assert sshd[:4] == ["exec", spec.slug, "/bin/sh", "-c"]
    assert sshd[5] == "sh"  # the script's $0; what follows are its arguments, as data
    args = sshd[6:]
    if exclusive:
        # The host's network: the sshd listens on the instance's port of the node's address.
        assert args[args.index("-p") + 1] == "30123"
        assert f"ListenAddress={host.address}" in args
        assert f"{host.address}:30123:22" not in run
    else:
        # Its own network namespace: 22 inside, published on that port of the node's address.
        assert args[args.index("-p") + 1] == "22"
        assert run[run.index(f"{host.address}:30123:22") - 1] == "-p"
    assert any("sshd listens on" in line for line in logs)
