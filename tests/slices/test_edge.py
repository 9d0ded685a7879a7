"""The production edge (issue 34), with the real parts: Debian's nginx rendered by
``console.edge`` in front of the console (uvicorn in a thread of this process, on the test
database), and for a web port an instance on a real sshd test host (runtime=process) whose
launch command serves files with ``python3 -m http.server``.

- nginx serves the collected static files itself, refuses a request body over its route's limit
  before the console reads a byte, and passes websockets through;
- a web port: nginx asks the console (``auth_request``) and then moves the bytes over an OpenSSH
  forward to the port on the node's loopback; the owner's download arrives intact, a visitor and
  another customer get the proxy's 404, and the grant ends at logout and at stop;
- the edge never forwards to a port that is not the instance's own (the node's ownership check),
  asked again in the background before its answer lapses, a "no" ending it;
- the auth subrequests reuse kept-alive connections; the node's sshd end of the forward has
  TCP_NODELAY; a master that died is started again; the tunnel target is kept 2 s, never past a
  state change;
- a driver without forwards (the simulated fleet) is relayed by the console behind nginx.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import os
import socket
import stat
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import websockets
from django.http import Http404
from django.test import Client

from console import edge as console_edge
from slices.choices import InstanceState
from slices.drivers import DriverError, get_driver
from slices.models import Instance
from slices.services import ports
from slices.services import proxy as proxy_service
from tests.support import edge as edge_support
from tests.support.apphosts import open_app, running_with_port
from tests.support.sshd import SshHostPool, configure_ssh_fleet, ssh_hosts  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def _not_open(response: httpx.Response) -> bool:
    """The proxy's own 404 (the console's page, in its language), as for an instance that does
    not exist."""
    return (
        response.status_code == 404
        and response.headers.get("cache-control") == "no-store"
        and response.headers.get("content-type", "").startswith("text/plain")
    )


@pytest.fixture
def edge(settings) -> Iterator[edge_support.Edge]:
    prefix = edge_support.short_dir()
    settings.EDGE_DIR = prefix
    static_root = prefix / "static"
    static_root.mkdir()
    (static_root / "edge-probe.txt").write_text("served by nginx\n")
    try:
        with (
            edge_support.console_in_thread() as web_port,
            edge_support.nginx_in_front([f"127.0.0.1:{web_port}"], prefix, static_root) as running,
        ):
            yield running
    finally:
        edge_support.cleanup(prefix)


def _session(user: Any) -> dict[str, str]:
    from django.conf import settings

    client = Client()
    client.force_login(user)
    return {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value}


def _app_client(edge: edge_support.Edge, instance: Instance, port: int) -> httpx.Client:
    return httpx.Client(
        base_url=edge.url,
        headers={"Host": f"{ports.app_host(instance, port)}:{edge.port}"},
        timeout=60,
    )


def _open(edge: edge_support.Edge, console: httpx.Client, instance: Instance, port: int):
    """The owner's Open through nginx, then the hand-off on the app host (through nginx too)."""
    opened = console.get(f"/instances/{instance.public_id}/web-ports/{port}/open/")
    assert opened.status_code == 302, opened.text
    url = urlsplit(opened.headers["location"])
    # The app host on the edge's port, the one the browser used (not the web process's).
    assert url.port == edge.port, opened.headers["location"]
    app = _app_client(edge, instance, port)
    landed = app.get(f"{url.path}?{url.query}")
    assert landed.status_code == 302 and ports.APP_COOKIE in app.cookies, landed.text
    return app


# -- the console behind nginx -------------------------------------------------------------------


def test_nginx_serves_static_refuses_big_bodies_and_passes_websockets(edge, alice) -> None:
    static = httpx.get(f"{edge.url}/static/edge-probe.txt")
    assert static.status_code == 200
    assert static.text == "served by nginx\n"  # a file only nginx's static root has
    assert static.headers["server"] == "nginx"

    # Over the anonymous limit (64 KiB) on the sign-in page: nginx's own 413, nothing for Django.
    big = httpx.post(f"{edge.url}/accounts/login/", content=b"x" * (200 * 1024))
    assert big.status_code == 413
    assert b"<center>nginx</center>" in big.content
    # Under /api/: the API's JSON error body, from nginx.
    api = httpx.post(
        f"{edge.url}/api/v1/instances/",
        content=b"{" + b" " * (3 * 1024 * 1024) + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert api.status_code == 413
    assert api.headers["x-gpc-edge"] == "body-limit"
    assert api.json()["error"] == "too_large"
    # A small one passes on to the console (which answers it: 401/403, not 413).
    small = httpx.post(f"{edge.url}/api/v1/instances/", json={})
    assert small.status_code in (401, 403)

    cookie = "; ".join(f"{k}={v}" for k, v in _session(alice).items())

    async def socket() -> str:
        async with websockets.connect(
            f"ws://127.0.0.1:{edge.port}/ws/notifications/",
            additional_headers={"Cookie": cookie},
            origin=f"http://127.0.0.1:{edge.port}",
            open_timeout=20,
        ) as ws:
            return str(ws.response.status_code if ws.response else 0)

    assert asyncio.run(socket()) == "101"


def test_the_edge_auth_answers_only_nginx(edge, alice) -> None:
    instance = running_with_port(alice)
    host = f"{ports.app_host(instance, 7860)}:{edge.port}"
    direct = httpx.get(f"{edge.url}/__gpc/edge-auth", headers={"Host": host})
    assert direct.status_code == 404
    # Nor does the secret of another key open it.
    forged = Client(HTTP_HOST=host).get(
        "/__gpc/edge-auth", HTTP_X_GPC_EDGE="0" * 64, HTTP_X_GPC_METHOD="GET"
    )
    assert forged.status_code == 404 and "X-Gpc-Upstream" not in forged


def test_a_simulated_port_is_relayed_by_the_console_behind_nginx(edge, alice, bob) -> None:
    instance = running_with_port(alice)
    console = httpx.Client(base_url=edge.url, cookies=_session(alice), timeout=30)
    app = _open(edge, console, instance, 7860)
    page = app.get("/")
    assert page.status_code == 200 and b"simulated" in page.content.lower()
    anonymous = _app_client(edge, instance, 7860).get("/")
    assert _not_open(anonymous), anonymous.text
    other = _app_client(edge, instance, 7860)
    other.cookies.update(_session(bob))
    assert _not_open(other.get("/"))


def test_the_auth_subrequests_reuse_kept_alive_connections(settings, alice) -> None:
    """nginx asks the console about every app-host request over its upstream's kept-alive
    connections (HTTP/1.1, no ``Connection: close``), not one new TCP connection each, and the
    console's answer says its empty body's length (nothing chunked to read to its end)."""
    prefix = edge_support.short_dir()
    settings.EDGE_DIR = prefix
    seen: list[tuple[str, int]] = []
    try:
        with (
            edge_support.console_in_thread(seen) as web_port,
            edge_support.nginx_in_front([f"127.0.0.1:{web_port}"], prefix, prefix) as edge,
        ):
            instance = running_with_port(alice)
            console = httpx.Client(base_url=edge.url, cookies=_session(alice), timeout=30)
            app = _open(edge, console, instance, 7860)
            seen.clear()
            for _ in range(20):
                assert app.get("/").status_code == 200
            auth_ports = [port for path, port in seen if path == "/__gpc/edge-auth"]
            assert len(auth_ports) == 20
            # Two nginx workers, each with its own pool: a handful of connections at most.
            assert len(set(auth_ports)) <= 4, sorted(set(auth_ports))

            asked = httpx.get(
                f"http://127.0.0.1:{web_port}/__gpc/edge-auth",
                headers={
                    "Host": f"{ports.app_host(instance, 7860)}:{edge.port}",
                    console_edge.SECRET_HEADER: console_edge.edge_secret(),
                },
            )
            assert asked.status_code == 401
            assert asked.headers.get("content-length") == "0"
            assert "transfer-encoding" not in asked.headers
    finally:
        edge_support.cleanup(prefix)


def test_the_tunnel_target_is_kept_for_seconds_never_past_a_state_change(alice, bob) -> None:
    """Dozens of requests at once (JupyterLab's files) ask for the same tunnel target: it is read
    once and kept ``TARGET_SECONDS``, for the instance as it was. A stop, a restart on new host
    ports, a release (any transition) reads it afresh; who may open the port is asked every
    time (a logout refuses the next request)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from slices.models import InstanceNode
    from slices.services.instances import transition

    proxy_service.forget_tunnel_targets()
    instance = running_with_port(alice)
    assert proxy_service.cached_tunnel_target(instance, 7860)[2] == 7860
    with CaptureQueriesContext(connection) as asked:
        assert proxy_service.cached_tunnel_target(instance, 7860)[2] == 7860
    assert len(asked.captured_queries) == 0

    # A restart publishes the port on another host port: the next state's target is read anew.
    InstanceNode.objects.filter(instance=instance).update(published_ports={"7860": 40123})
    assert transition(instance, InstanceState.STOPPING, code="stopping")
    assert transition(instance, InstanceState.STOPPED, code="stopped")
    assert transition(instance, InstanceState.STARTING, code="starting")
    assert transition(instance, InstanceState.PROVISIONING, code="provisioning")
    assert transition(instance, InstanceState.RUNNING, code="running")
    instance.refresh_from_db()
    assert proxy_service.cached_tunnel_target(instance, 7860)[2] == 40123

    # The decision is never kept: the grant is checked on every request.
    client = Client()
    client.force_login(alice)
    app = open_app(client, instance, 7860)
    cookie = app.cookies[ports.APP_COOKIE].value
    assert proxy_service.resolve_access(instance.public_id, 7860, cookie).node_port == 40123
    ports.end_user_grants(alice)
    with pytest.raises(Http404):
        proxy_service.resolve_access(instance.public_id, 7860, cookie)


# -- a web port on a real sshd host: nginx moves the bytes ----------------------------------------


@pytest.fixture
def funded(alice: Any) -> Any:
    from billing import services as billing
    from billing.models import PriceBook
    from billing.seed import seed_default_prices

    if not PriceBook.objects.exists():
        seed_default_prices()
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    return alice


@pytest.fixture
def files_instance(
    settings,
    ssh_hosts: SshHostPool,  # noqa: F811
    tmp_path: Path,
    funded,
    django_capture_on_commit_callbacks,
) -> Iterator[tuple[Instance, int, str]]:
    """An instance on an sshd test host serving a 20 MB file on a declared web port."""
    with edge_support.files_instance(
        settings,
        ssh_hosts,
        tmp_path,
        funded,
        django_capture_on_commit_callbacks,
        size=20 * 1024 * 1024,
        name="edge-files",
    ) as served:
        yield served


def test_a_web_port_through_nginx_over_an_openssh_forward(
    edge,
    files_instance,
    funded,
    bob,
    ssh_hosts: SshHostPool,  # noqa: F811
    django_capture_on_commit_callbacks,
) -> None:
    _web_port_journey(
        edge, files_instance, funded, bob, ssh_hosts, django_capture_on_commit_callbacks
    )


@pytest.mark.integration
def test_the_production_stack_serves_a_web_port_through_the_edge(
    edge,
    files_instance,
    funded,
    bob,
    ssh_hosts: SshHostPool,  # noqa: F811
    django_capture_on_commit_callbacks,
) -> None:
    """The same journey in the integration run (`make test-integration`: PostgreSQL,
    channels-redis, the production settings), the console behind the real nginx."""
    from django.conf import settings

    assert settings.PRODUCTION
    _web_port_journey(
        edge, files_instance, funded, bob, ssh_hosts, django_capture_on_commit_callbacks
    )


def _web_port_journey(
    edge: edge_support.Edge,
    files_instance: tuple[Instance, int, str],
    funded: Any,
    bob: Any,
    ssh_hosts: SshHostPool,  # noqa: F811
    django_capture_on_commit_callbacks: Any,
) -> None:
    instance, port, digest = files_instance
    console = httpx.Client(base_url=edge.url, cookies=_session(funded), timeout=60)
    app = _open(edge, console, instance, port)

    with app.stream("GET", "/big.bin") as response:
        assert response.status_code == 200
        got = hashlib.sha256()
        for chunk in response.iter_bytes():
            got.update(chunk)
    assert got.hexdigest() == digest

    # The bytes went through an OpenSSH forward's unix socket, the console user's alone.
    socks = list((edge.prefix / "tunnels").glob("*.sock"))
    assert len(socks) == 1
    mode = socks[0].stat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) & 0o077 == 0
    known = next((edge.prefix / "tunnels").glob("*.known_hosts")).read_text()
    # The pinned key, and no other (StrictHostKeyChecking=yes against it).
    assert known.split()[1:3] == ssh_hosts.get(1)[0].host_key_line.split()[:2]

    # A visitor, and another customer with their own console session, get the proxy's 404.
    anonymous = _app_client(edge, instance, port).get("/big.bin")
    assert _not_open(anonymous), anonymous.text
    other = _app_client(edge, instance, port)
    other.cookies.update(_session(bob))
    assert _not_open(other.get("/big.bin"))
    # A cross-site write is refused before it reaches the app.
    cross = app.post("/big.bin", content=b"x", headers={"Origin": "https://evil.example"})
    assert cross.status_code == 403

    # Logout ends the owner's grant: the very next request is refused.
    assert app.get("/").status_code == 200
    ports.end_user_grants(funded)
    assert _not_open(app.get("/"))

    # Open again, then stop: refused again.
    app = _open(edge, console, instance, port)
    assert app.get("/").status_code == 200
    from slices.services.power import stop_instance

    with django_capture_on_commit_callbacks(execute=True):
        stop_instance(Instance.objects.get(pk=instance.pk), by="test")
    assert _not_open(app.get("/"))


def _tcp_ends() -> dict[int, tuple[int, int]]:
    """Every IPv4 TCP socket of this machine: its inode → (local port, remote port)."""
    ends = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], int(fields[9])
        ends[inode] = (int(local.split(":")[1], 16), int(remote.split(":")[1], 16))
    return ends


def _socket_fds(pid: int) -> dict[int, int]:
    """A process's sockets: inode → its fd there."""
    found = {}
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    found[int(target[8:-1])] = int(fd)
    return found


def _no_delay_of(pid: int, fd: int) -> bool:
    """Whether Nagle's algorithm is off on another process's socket (a copy of its fd, taken
    with pidfd_getfd: Linux 5.6, the same user or root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        copy = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd, one number on every architecture
        assert copy >= 0, os.strerror(ctypes.get_errno())
    finally:
        os.close(pidfd)
    with socket.socket(fileno=copy) as sock:
        return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


def _master_pids(tunnels: Path) -> list[int]:
    """The edge's OpenSSH masters for ``tunnels``: their command lines name it, with ``-M``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            if str(tunnels).encode() in argv and b"\0-M\0" in argv:
                found.append(int(pid))
    return found


def _node_end_of_the_edge_connection(tunnels: Path, sshd_port: int) -> tuple[int, int]:
    """(pid, fd) of the node's sshd end of the edge's OpenSSH master connection."""
    ends = _tcp_ends()
    masters = _master_pids(tunnels)
    assert len(masters) == 1, masters
    (client_port,) = [
        ends[inode][0]
        for inode in _socket_fds(masters[0])
        if inode in ends and ends[inode][1] == sshd_port
    ]
    (inode,) = [i for i, (lp, rp) in ends.items() if (lp, rp) == (sshd_port, client_port)]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fds = _socket_fds(int(pid))
        if inode in fds:
            return int(pid), fds[inode]
    raise AssertionError("no process holds sshd's end of the edge's connection")


def test_the_node_answers_small_writes_without_nagles_delay(
    edge,
    files_instance,
    funded,
    ssh_hosts: SshHostPool,  # noqa: F811
) -> None:
    """sshd turns Nagle's algorithm off on a connection only once a session starts there: the
    edge's master runs one, so the node's small writes (a chat's tokens) are not held back
    waiting for the edge's delayed ACK (up to 40 ms each)."""
    instance, port, _digest = files_instance
    console = httpx.Client(base_url=edge.url, cookies=_session(funded), timeout=60)
    app = _open(edge, console, instance, port)
    assert app.get("/").status_code == 200  # through the forward: the master is up
    pid, fd = _node_end_of_the_edge_connection(edge.prefix / "tunnels", ssh_hosts.get(1)[0].port)
    assert _no_delay_of(pid, fd)


def test_a_master_that_died_is_started_again(edge, files_instance, funded) -> None:
    """The edge asks its control socket whether a master still listens (a connect, no process
    started); one that died leaves the socket file behind, is found gone, and is started again
    with its forwards: the next request is served."""
    import signal
    import time

    from slices.drivers.ssh import edge as ssh_edge

    instance, port, _digest = files_instance
    console = httpx.Client(base_url=edge.url, cookies=_session(funded), timeout=60)
    app = _open(edge, console, instance, port)
    assert app.get("/").status_code == 200
    tunnels = edge.prefix / "tunnels"
    (master,) = _master_pids(tunnels)
    os.kill(master, signal.SIGKILL)
    while _master_pids(tunnels):
        time.sleep(0.05)
    assert list(tunnels.glob("*.ctl")), "the dead master's control socket is left behind"
    time.sleep(ssh_edge.ALIVE_SECONDS)  # what this process knew of it has lapsed
    assert app.get("/").status_code == 200
    (again,) = _master_pids(tunnels)
    assert again != master


def test_the_ports_owner_is_asked_again_ahead_of_time_and_a_failed_answer_ends_it(
    files_instance, django_capture_on_commit_callbacks
) -> None:
    """The node's word that the port is the instance's own is taken for OWNER_CHECK_SECONDS;
    past half of it, the next use asks again in the background (so steady traffic never waits
    for the node) and, when the answer is no, the word is forgotten: the next use asks itself
    and is refused."""
    import time

    from slices.drivers.ssh import tunnel
    from slices.services.power import stop_instance

    instance, port, _digest = files_instance
    spec, node, node_port = proxy_service.tunnel_target(instance, port)
    driver: Any = get_driver(instance.driver or None)
    owner = driver._port_owner(spec, node, node_port)  # noqa: SLF001 - the driver's own check
    tunnel.close_all()
    tunnel.check_owner(driver, node, node_port, owner)
    key = (tunnel._key(driver, node), owner[0], node_port)  # noqa: SLF001

    def word_left() -> float:
        with tunnel._SHARED.lock:  # noqa: SLF001
            return tunnel._SHARED.owned.get(key, 0.0) - time.monotonic()  # noqa: SLF001

    def age_word() -> None:  # as if the node said so 1.5 s ago
        with tunnel._SHARED.lock:  # noqa: SLF001
            tunnel._SHARED.owned[key] = time.monotonic() + 0.5  # noqa: SLF001

    def wait_for(condition: Any) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline
            time.sleep(0.02)

    # Still the instance's: asked again behind the request's back, the word renewed.
    age_word()
    tunnel.check_owner(driver, node, node_port, owner)
    wait_for(lambda: word_left() > 1.0)

    # The instance stops: the next use (on a word 1.5 s old) passes, its background check hears
    # no, and the use after that asks itself and is refused.
    with django_capture_on_commit_callbacks(execute=True):
        stop_instance(Instance.objects.get(pk=instance.pk), by="test")
    age_word()
    tunnel.check_owner(driver, node, node_port, owner)
    wait_for(lambda: word_left() <= 0)
    with pytest.raises(DriverError) as refused:
        tunnel.check_owner(driver, node, node_port, owner)
    assert refused.value.code == "port_closed"


def test_the_edge_never_forwards_a_port_that_is_not_the_instances(edge, files_instance) -> None:
    """The node's ownership check runs before a forward is made: a port another process listens
    on (here nginx's own, on the test host) is refused, and no socket is made for it."""
    instance, _port, _digest = files_instance
    spec, node, _node_port = proxy_service.tunnel_target(instance, _port)
    driver: Any = get_driver(instance.driver or None)
    with pytest.raises(DriverError) as refused:
        driver.edge_socket(spec, node, edge.port, str(edge.prefix / "tunnels"))
    assert refused.value.code == "port_not_instance"
    assert not list((edge.prefix / "tunnels").glob("*.sock"))
    assert console_edge.is_edge(console_edge.edge_secret())


# -- the rendered configuration ------------------------------------------------------------------


def test_the_rendered_configuration_mirrors_the_body_limits_and_nginx_accepts_it(
    settings, tmp_path: Path
) -> None:
    """Each REQUEST_BODY_LIMITS route gets its own limit in nginx, the rest the default, the app
    hosts the port proxy's; ``manage.py edge --render-only`` writes a file ``nginx -t`` accepts,
    readable by its owner only (it holds the edge's secret)."""
    import subprocess

    from django.core.management import call_command

    prefix = edge_support.short_dir()
    settings.EDGE_DIR = prefix
    try:
        call_command("edge", "--render-only", "--listen", "127.0.0.1:1", "--web", "127.0.0.1:2")
        conf = prefix / "nginx.conf"
        text = conf.read_text()
        for pattern, limit in settings.REQUEST_BODY_LIMITS:
            block = text.split(f'location ~ "^{pattern}" {{', 1)[1].split("}", 1)[0]
            assert f"client_max_body_size {limit};" in block
        assert f"client_max_body_size {settings.REQUEST_BODY_MAX_BYTES};" in text
        assert f"client_max_body_size {settings.PORT_PROXY_BODY_MAX_BYTES};" in text
        assert console_edge.edge_secret() in text
        assert stat.S_IMODE(conf.stat().st_mode) == 0o600
        checked = subprocess.run(
            [*console_edge.command(conf, prefix), "-t", "-q"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert checked.returncode == 0, checked.stderr
    finally:
        edge_support.cleanup(prefix)
