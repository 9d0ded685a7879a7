"""The SSH driver's web terminal: a PTY in the instance over the console's pinned connection.

``open_ssh_shell`` opens a session channel with a PTY on a connection to the node (host key
pinned as for every step: ``SshConnections._connect``) and runs one fixed command in it:

- docker: ``docker exec -it -e TERM=xterm-256color <slug> /bin/sh -c <pick a shell>``;
- enroot: ``enroot exec <pid> /bin/sh -c <pick a shell>``, the pid being the instance's
  container process (the child of the instance's PID namespace's init, as that namespace numbers
  it), run inside that namespace;
- process: ``xargs -0 -a <argument file>`` running ``env -i NAME=value... /bin/sh -c <pick a
  shell>`` in the instance's directory and PID namespace: the instance's environment (the same
  values ``start`` gives its workload) reaches the shell as data in an argument file written over
  SFTP, which the shell deletes as it starts; the host's shell never evaluates any of it.

For both, ``nsenter -t <the namespace's init> -p -m`` comes first (the process rule, SECURITY.md):
whatever the terminal starts, daemonised or not, ends when the instance stops; a terminal opens
only while the instance runs ("the instance is not running" otherwise).

"<pick a shell>" is fixed text run inside the instance: a login bash where there is one, else
sh. Nothing the customer typed reaches the host's shell: keystrokes go to the PTY, which belongs
to the instance's shell.

Connections are shared between the terminals of a node (paramiko multiplexes channels), at most
``CHANNELS_PER_CONNECTION`` on each (OpenSSH's ``MaxSessions`` is 10 by default), and closed when
their last terminal closes.
"""

from __future__ import annotations

import contextlib
import secrets
import select
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import paramiko

from slices.drivers.base import DriverError, InstanceSpec, NodeTarget
from slices.drivers.ssh.commands import (
    ENTER_EXEC,
    ENTER_FIND,
    ENV,
    NSENTER,
    SH,
    XARGS,
    argument_file,
    render,
)

if TYPE_CHECKING:
    from slices.drivers.ssh.driver import SshDriver

TERM = "xterm-256color"
CHANNELS_PER_CONNECTION = 8
READ_BYTES = 65536
# Fixed text, run by /bin/sh inside the instance (never on the host): a login bash, else sh.
PICK_SHELL = "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi"
# The process runtime: the argument file is $1 of the shell that deletes it before the login
# shell starts (so the environment does not stay on the node's disk in a second copy).
PICK_SHELL_DELETING = 'rm -f -- "$1"; ' + PICK_SHELL

CMD_SHELL_DOCKER = "exec {docker} exec -it -e {term} {name} {sh} -c {pick}"
# Both join the instance's PID and mount namespaces first (``commands.ENTER_*``: the process
# rule), so what is started from the terminal ends with the instance, daemonised or not. enroot
# execs into the container process (the namespace init's child), named as the namespace sees it.
CMD_SHELL_ENROOT = (
    ENTER_FIND + 'x=$(ps -o pid= --ppid "$c" | head -n 1 | tr -d " "); '
    "x=$(awk '/^NSpid:/ {{ print $NF }}' \"/proc/${{x:-0}}/status\" 2>/dev/null); "
    '[ -n "$x" ] || {{ echo "the instance is not running" >&2; exit 5; }}; '
    + ENTER_EXEC
    + '{enroot} exec "$x" {sh} -c {pick}'
)
CMD_SHELL_PROCESS = (
    "cd {root} || exit 1; "
    + ENTER_FIND
    + ENTER_EXEC
    + "{xargs} -0 -x -n {count} -s {size} -a {args} {launcher}"
)


@dataclass
class _Connection:
    client: paramiko.SSHClient
    users: int = 0


@dataclass
class _SharedConnections:
    """Connections to the nodes held by open terminals (the steps' pool is per driver and lends a
    connection to one step at a time; terminals live longer and share theirs)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    by_node: dict[tuple[str, ...], list[_Connection]] = field(default_factory=dict)

    def acquire(self, driver: SshDriver, node: NodeTarget) -> _Connection:
        key = (
            driver.settings.key_file,
            driver.settings.user,
            node.hostname,
            node.address,
            str(node.port),
            node.host_key,
        )
        with self.lock:
            conns = self.by_node.setdefault(key, [])
            for conn in list(conns):
                transport = conn.client.get_transport()
                if transport is None or not transport.is_active():
                    conns.remove(conn)  # dropped: its terminals see their channels end
                    continue
                if conn.users < CHANNELS_PER_CONNECTION:
                    conn.users += 1
                    return conn
        client = driver._connect(node)  # the pinned host key, checked again
        conn = _Connection(client, users=1)
        with self.lock:
            self.by_node.setdefault(key, []).append(conn)
        return conn

    def release(self, conn: _Connection) -> None:
        with self.lock:
            conn.users -= 1
            if conn.users > 0:
                return
            for conns in self.by_node.values():
                if conn in conns:
                    conns.remove(conn)
        conn.client.close()


SHARED = _SharedConnections()


class SshShell:
    """One PTY channel. ``recv`` waits on the channel (its pipe, via ``select``); ``send``,
    ``resize`` and ``close`` may be called from other threads meanwhile."""

    simulated = False

    def __init__(self, channel: paramiko.Channel, conn: _Connection) -> None:
        self._chan = channel
        self._conn = conn
        self._lock = threading.Lock()
        self._closed = False

    def send(self, data: bytes) -> None:
        if self._closed or self._chan.closed:
            raise DriverError("terminal_closed", "the terminal has ended")
        try:
            self._chan.sendall(data)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise DriverError("terminal_closed", f"{type(exc).__name__}: {exc}") from None

    def recv(self, timeout: float) -> bytes | None:
        chan = self._chan
        if self._closed:
            return None
        if not (chan.recv_ready() or chan.recv_stderr_ready()):
            if chan.closed or (chan.eof_received and chan.exit_status_ready()):
                return None
            try:
                select.select([chan], [], [], max(0.0, timeout))
            except (OSError, ValueError):  # closed by another thread meanwhile
                return None
        data = b""
        try:
            if chan.recv_ready():
                data += chan.recv(READ_BYTES)
            if chan.recv_stderr_ready():
                data += chan.recv_stderr(READ_BYTES)
        except (OSError, EOFError, paramiko.SSHException):
            return None
        if data:
            return data
        if chan.closed or chan.eof_received:
            return None
        return b""

    def resize(self, cols: int, rows: int) -> None:
        if self._closed or self._chan.closed:
            return
        # A terminal that is ending cannot be resized: recv says it ended.
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self._chan.resize_pty(width=cols, height=rows)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._chan.close()
        finally:
            SHARED.release(self._conn)


def _command(driver: SshDriver, spec: InstanceSpec, node: NodeTarget, conn: _Connection) -> str:
    """The fixed command that starts the instance's shell on ``node`` (see the module)."""
    paths = driver._paths(spec, node)
    runtime = driver._runtime(node)
    if runtime == "docker":
        docker = driver._binary(driver.settings.docker_bin, "SLICES_DOCKER_BIN")
        script = render(
            CMD_SHELL_DOCKER, docker=docker, term=f"TERM={TERM}", name=spec.slug, sh=SH,
            pick=PICK_SHELL,
        )  # fmt: skip
    elif runtime == "enroot":
        enroot = driver._binary(driver.settings.enroot_bin, "SLICES_ENROOT_BIN")
        script = render(
            CMD_SHELL_ENROOT, pid=paths.pid, root=paths.root, nsenter=NSENTER, enroot=enroot,
            sh=SH, pick=PICK_SHELL,
        )  # fmt: skip
    else:
        env = driver._node_env(spec, node, paths)
        env["TERM"] = TERM
        args_file = f"{paths.root}/shell-{secrets.token_hex(8)}.args"
        argv = [f"{k}={v}" for k, v in env.items()] + [SH, "-c", PICK_SHELL_DELETING, SH, args_file]
        body, count, size = argument_file(argv)
        driver.write_files(conn.client, paths.root, [(args_file, body, 0o600)])
        script = render(
            CMD_SHELL_PROCESS, root=paths.root, pid=paths.pid, nsenter=NSENTER, xargs=XARGS,
            count=count, size=size, args=args_file, launcher=[ENV, "-i"],
        )  # fmt: skip
    return driver.host_command(script)


def open_ssh_shell(
    driver: SshDriver, spec: InstanceSpec, node: NodeTarget, cols: int, rows: int
) -> SshShell:
    conn = SHARED.acquire(driver, node)
    channel: paramiko.Channel | None = None
    try:
        command = _command(driver, spec, node, conn)
        transport = conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise DriverError("unreachable", f"{node.hostname}: the connection was lost")
        channel = transport.open_session(timeout=driver.settings.connect_timeout)
        channel.get_pty(term=TERM, width=cols, height=rows)
        channel.exec_command(command)  # noqa: S601 - a fixed template, every argument quoted
    except DriverError:
        if channel is not None:
            channel.close()
        SHARED.release(conn)
        raise
    except (OSError, EOFError, paramiko.SSHException) as exc:
        if channel is not None:
            channel.close()
        SHARED.release(conn)
        raise DriverError(
            "unreachable", f"{node.hostname}: {type(exc).__name__}: {exc}"[:300]
        ) from None
    return SshShell(channel, conn)
