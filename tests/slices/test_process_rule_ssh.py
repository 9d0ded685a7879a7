"""The process rule (issue 29, SECURITY.md), on real sshd test hosts with runtime=process: every
process of an instance lives in one PID namespace that 关机 and release end as a whole, whichever
door it came in by, and a web port reaches only what the instance itself listens on.

Each door starts the same daemonised set, as a tenant would: ``nohup``, ``setsid``, a double fork,
bash's ``disown``, and a ``setsid nohup`` HTTP server on a port of its own:

- the launch command (an ordered instance's entrypoint);
- the web terminal (the console's terminal service, the same call its websocket makes);
- SSH through the region's gateway (the OpenSSH client, the command the page shows);
- an AI application's start command (``apps.launch_app``).

Then the instance is stopped or released, and no process of any door may be left, nor any of
their ports listening. Each daemon is found by its own arguments (a sleep of a unique length, a
server on a unique port), not by anything the driver records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from console.models import User
from marketplace import aiapps
from slices import services
from slices.choices import InstanceState
from slices.drivers import DriverError, get_driver
from slices.models import Instance, Node, Region
from slices.services import apps, power, proxy, terminal
from tests.slices.factories import load_small_fleet, run_order
from tests.slices.test_ssh_gateway import Customer, _customer, _endpoint, _run_as_shown
from tests.support import servers
from tests.support.sshd import (  # noqa: F401
    SshFleet,
    SshGateway,
    SshHostPool,
    configure_ssh_fleet,
    configure_ssh_gateway,
    instance_namespace,
    namespace_members,
    process_alive,
    ssh_hosts,
    start_gateway,
    stop_pids,
)

pytestmark = pytest.mark.django_db
PYTHON = "/usr/bin/python3"
NODE = "xm-4090-r01-n01"


@pytest.fixture(scope="module")
def gateway(ssh_hosts: SshHostPool) -> Iterator[SshGateway]:  # noqa: F811
    gw = start_gateway(ssh_hosts, "gateway-process-rule")
    yield gw
    gw.stop()


@pytest.fixture
def fleet(settings, ssh_hosts: SshHostPool, gateway: SshGateway, tmp_path: Path) -> SshFleet:  # noqa: ANN001, F811
    """One RTX 4090 node of Xiamen on one test host (the others out of the pool), Xiamen's
    gateway on another sshd."""
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SSH_CONNECT_TIMEOUT = 5.0
    settings.SLICES_SSH_COMMAND_TIMEOUT = 60.0
    load_small_fleet()
    node = Node.objects.get(hostname=NODE)
    for other in Node.objects.filter(cluster__code="xm-4090").exclude(pk=node.pk):
        services.change_node_state(other, "maintenance", "not a test host")
    fleet = configure_ssh_fleet(
        settings, ssh_hosts.get(1), [node], tmp_path, client_key=ssh_hosts.client_key
    )
    configure_ssh_gateway(gateway, Region.objects.get(code="xiamen"))
    return fleet


@dataclasses.dataclass
class Door:
    """What one door starts: five daemonised sleeps of unique lengths and an HTTP server."""

    name: str
    sleeps: tuple[int, ...]
    port: int
    serve: str = ""  # the server's options (its directory)

    @classmethod
    def make(cls, name: str, port: int | None = None, serve: str = "") -> Door:
        base = 7_000_000 + secrets.randbelow(100_000) * 10
        door = cls(name, tuple(base + i for i in range(5)), port or servers.free_port(), serve)
        _MADE.append(door)
        return door

    def script(self) -> str:
        """One line for sh or bash: every way a tenant keeps a process after its shell ends."""
        quiet = ">/dev/null 2>&1 </dev/null"
        a, b, c, d, e = self.sleeps
        return " ".join(
            [
                f"nohup /bin/sleep {a} {quiet} &",
                f"/usr/bin/setsid /bin/sleep {b} {quiet} &",
                f"( /bin/sleep {c} {quiet} & ) ;",
                f"/bin/bash -c '/bin/sleep {d} {quiet} & disown' ;",
                # A double fork into a session of its own: no longer anyone's descendant.
                f"( /usr/bin/setsid /bin/sleep {e} {quiet} & ) ;",
                f"/usr/bin/setsid /usr/bin/nohup {PYTHON} -m http.server --bind 127.0.0.1 "
                f"{self.serve} {self.port} {quiet} &",
            ]
        )

    def alive(self) -> list[int]:
        """This door's processes still running on the machine (the test hosts run here)."""
        wanted = {str(s).encode() for s in self.sleeps} | {str(self.port).encode()}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
                kind = argv[0].endswith(b"sleep") or b"http.server" in argv
                ours = len(argv) > 1 and kind and argv[-1] in wanted
                if ours and process_alive(int(entry.name)):
                    found.append(int(entry.name))
        return found

    def listening(self) -> bool:
        with socket.socket() as s:
            s.settimeout(1.0)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def wait_started(self) -> None:
        deadline = time.monotonic() + 30
        while len(self.alive()) < len(self.sleeps) + 1 or not self.listening():
            assert time.monotonic() < deadline, f"{self.name}: started {self.alive()}"
            time.sleep(0.1)


_MADE: list[Door] = []


@pytest.fixture(autouse=True)
def _no_survivor_left_behind() -> Iterator[None]:
    """What a failing test left running is stopped (by pid) once it is over."""
    yield
    while _MADE:
        stop_pids(_MADE.pop().alive())


def _through_terminal(user: User, inst: Instance, door: Door) -> None:
    """Type the door's line into the instance's web terminal, wait for its processes, and close
    the terminal (a hangup: nohup and setsid are there to survive it)."""
    grant = terminal.authorize(user, inst.public_id, 0)
    shell = get_driver(grant.driver).open_shell(grant.spec, grant.node, 120, 40)
    try:
        shell.send(f"{door.script()} echo door-$((40+2))\r".encode())
        out = b""
        deadline = time.monotonic() + 30
        while b"door-42" not in out:
            assert time.monotonic() < deadline, out
            chunk = shell.recv(1.0)
            assert chunk is not None, out
            out += chunk
        door.wait_started()  # then the tab is closed: what has not yet ignored SIGHUP is gone
    finally:
        shell.close()


def _everything_through_every_door(
    fleet: SshFleet, gateway: SshGateway, alice: User, tmp_path: Path, capture: Any
) -> tuple[Instance, list[Door]]:
    customer: Customer = _customer(alice, tmp_path, gateway)
    launch, term, ssh = Door.make("launch"), Door.make("terminal"), Door.make("ssh")
    inst = run_order(
        alice,
        capture,
        cards=8,
        name="doors",
        entrypoint=f"{launch.script()} exec /bin/sleep infinity",
    )
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "text"))
    launch.wait_started()
    _through_terminal(alice, inst, term)
    term.wait_started()
    _endpoint(fleet, customer, inst)
    done = _run_as_shown(customer, inst, ssh.script())
    assert done.returncode == 0, done.stderr
    ssh.wait_started()
    return inst, [launch, term, ssh]


def _assert_all_ended(doors: list[Door]) -> None:
    # Stop and release wait for the instance's processes to end: nothing is polled for here
    # beyond the instant a KILL takes to be reaped.
    deadline = time.monotonic() + 5
    while any(d.alive() for d in doors) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {d.name: d.alive() for d in doors if d.alive()}
    assert left == {}, f"survived: {left}"
    assert [d.name for d in doors if d.listening()] == []


def test_release_ends_what_every_door_daemonised(
    fleet: SshFleet,
    gateway: SshGateway,
    alice: User,
    tmp_path: Path,
    django_capture_on_commit_callbacks,
) -> None:
    inst, doors = _everything_through_every_door(
        fleet, gateway, alice, tmp_path, django_capture_on_commit_callbacks
    )
    launcher = int((fleet.workdirs[NODE] / "instances" / inst.slug / "pid").read_text())
    namespace = instance_namespace(launcher)
    inside = set(namespace_members(namespace))
    assert all(set(d.alive()) <= inside for d in doors), (
        "every door's processes share one namespace"
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert services.release_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RELEASED
    _assert_all_ended(doors)
    assert namespace_members(namespace) == []


def test_stop_ends_what_every_door_daemonised_and_start_runs_only_the_workload(
    fleet: SshFleet,
    gateway: SshGateway,
    alice: User,
    tmp_path: Path,
    django_capture_on_commit_callbacks,
) -> None:
    inst, doors = _everything_through_every_door(
        fleet, gateway, alice, tmp_path, django_capture_on_commit_callbacks
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert power.stop_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.STOPPED
    _assert_all_ended(doors)

    # 开机: the launch command runs again, and only it (the terminal's and SSH's daemons are gone
    # for good); release then ends it too.
    with django_capture_on_commit_callbacks(execute=True):
        power.start_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING
    launch, term, ssh = doors
    launch.wait_started()
    assert term.alive() == [] and ssh.alive() == []
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(inst, by="alice")
    _assert_all_ended(doors)


def test_an_apps_daemonised_server_ends_at_release(
    full_catalogue,
    settings,
    fleet: SshFleet,
    alice: User,
    django_capture_on_commit_callbacks,
) -> None:
    """An AI application whose start command daemonises its server (which answers the app's
    health check through the console's tunnel) and more before it goes on running: release
    leaves none of it."""
    from billing import services as billing

    settings.APP_HEALTH_INTERVAL = 0.2
    billing.grant_trial_credit(alice)
    app = aiapps.get_app("llm-chat")
    assert app is not None
    assert app.health.port == 8000 and app.health.path == "/healthz"
    door = Door.make("app", port=app.health.port, serve="--directory health")
    (fleet.asset_root / "models" / app.default_model).mkdir(parents=True)
    daemonising = dataclasses.replace(
        app,
        command=f"mkdir -p health && : > health/healthz; {door.script()} exec /bin/sleep infinity",
    )
    with django_capture_on_commit_callbacks(execute=True):
        inst = apps.launch_app(alice, daemonising, accept_license=True)
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "text"))
    door.wait_started()
    assert apps.is_ready(inst), "the health check answered through the tunnel"
    with django_capture_on_commit_callbacks(execute=True):
        assert services.release_instance(inst, by="alice")
    _assert_all_ended([door])


# -- a web port reaches the instance's own processes only ---------------------------------------


@pytest.fixture
def foreign_server() -> Iterator[tuple[int, int]]:
    """A server of this machine that is no instance's (on a test host: the console itself): its
    port and its listening socket's inode."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", servers.free_port()), http.server.SimpleHTTPRequestHandler
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], os.fstat(server.socket.fileno()).st_ino
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def _http_status(chan: Any) -> bytes:
    chan.settimeout(10)
    chan.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
    head = b""
    while b"\r\n" not in head:
        chunk = chan.recv(4096)
        if not chunk:
            break
        head += chunk
    chan.close()
    return head.split(b"\r\n", 1)[0]


def test_a_web_port_reaches_only_what_the_instance_listens_on(
    fleet: SshFleet,
    funded: User,
    foreign_server: tuple[int, int],
    django_capture_on_commit_callbacks,
) -> None:
    """Through the driver's tunnel (what the port proxy and an app's health check use): the
    instance's own server answers; a port held by a process that is not the instance's (the
    console on a test host, another tenant) is refused before a byte reaches it, and so is a
    port nothing listens on. The tenant's workload holds open a file whose name ends in a line
    that reads like the foreign socket's link (``socket:[<inode>]``): it is not taken for it."""
    foreign, inode = foreign_server
    door = Door.make("launch")
    forge = f"f=$(printf 'forged\\nsocket:[%s]' {inode}); : > \"$f\";"
    inst = run_order(
        funded,
        django_capture_on_commit_callbacks,
        cards=8,
        name="ports",
        entrypoint=f'{forge} {door.script()} exec /bin/sleep infinity 3<"$f"',
    )
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "text"))
    door.wait_started()
    launcher = int((fleet.workdirs[NODE] / "instances" / inst.slug / "pid").read_text())
    links = []
    for pid in namespace_members(instance_namespace(launcher)):
        with contextlib.suppress(OSError):
            links += [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()]
    assert any(link.endswith(f"\nsocket:[{inode}]") for link in links), "the forgery is held"
    driver: Any = get_driver(inst.driver or None)
    spec, node, _port = proxy.tunnel_target(inst, door.port)

    assert _http_status(driver.open_tunnel(spec, node, door.port)).startswith(b"HTTP/1.0 200")
    with pytest.raises(DriverError) as refused:
        driver.open_tunnel(spec, node, foreign)
    assert refused.value.code == "port_not_instance"
    with pytest.raises(DriverError) as closed:
        driver.open_tunnel(spec, node, servers.free_port())
    assert closed.value.code == "port_closed"

    with django_capture_on_commit_callbacks(execute=True):
        assert services.release_instance(inst, by="alice")
    _assert_all_ended([door])
