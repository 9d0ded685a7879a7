"""OpenSSH (C) forwards for the production edge (issue 34): nginx moves an app's bytes, not
Python.

For each node the console starts one OpenSSH master (``ssh -M -N -f``, ``ControlPersist``) with
the console's key and the node's pinned host key only (``StrictHostKeyChecking=yes`` against a
known_hosts file written from the inventory's key, or from the key paramiko verified against a
pinned fingerprint; never ``accept-new``), and asks it for one unix-socket forward per instance
port (``ssh -O forward -L <socket>:127.0.0.1:<port>``): a connection to the socket becomes a
``direct-tcpip`` channel to the port on the node's loopback, so nothing is published on the
node's public interfaces. The sockets are the console user's alone (``StreamLocalBindMask``
0177) and their names are unguessable hashes; nginx reaches one only when the console's answer
to its auth subrequest names it, after the same ownership check as paramiko's tunnels
(``tunnel.OWNER_CHECK_SECONDS``). paramiko stays the control channel (that check, every step).

Several web processes share the masters through their control sockets, one at a time per node
(a file lock in the folder).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from slices.drivers.base import DriverError, NodeTarget
from slices.drivers.ssh import tunnel
from slices.drivers.ssh.client import SshConnections, parse_key_line

SSH = "/usr/bin/ssh"
# How long this process takes a master's word that it is up without asking it again.
ALIVE_SECONDS = 2.0
_alive: dict[str, float] = {}
_alive_lock = threading.Lock()


def _node_id(conns: SshConnections, node: NodeTarget) -> str:
    raw = "\0".join(map(str, tunnel._key(conns, node)))  # noqa: SLF001 - the tunnels' own key
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def socket_path(
    folder: Path, conns: SshConnections, node: NodeTarget, slug: str, port: int
) -> Path:
    """The forward's socket: short (a unix socket's path has 107 bytes) and unguessable."""
    nid = _node_id(conns, node)
    name = hashlib.sha256(f"{nid}\0{slug}\0{int(port)}".encode()).hexdigest()[:24]
    return folder / f"{nid[:8]}-{name}.sock"


def _args(conns: SshConnections, node: NodeTarget, folder: Path, nid: str) -> list[str]:
    s = conns.settings
    if not s.key_file:
        raise DriverError("ssh_key_missing", "SLICES_SSH_KEY_FILE is not set", permanent=True)
    return [
        SSH,
        "-F",
        "/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={folder / (nid + '.known_hosts')}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        f"HostKeyAlias=gpc-{nid}",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "IdentityAgent=none",
        "-i",
        s.key_file,
        "-o",
        f"ControlPath={folder / (nid + '.ctl')}",
        "-o",
        f"ConnectTimeout={max(1, int(s.connect_timeout))}",
        "-o",
        f"ServerAliveInterval={max(5, int(s.keepalive or 15))}",
        "-o",
        "ServerAliveCountMax=3",
        "-o",
        # AES-GCM first (AES-NI), as bench/access.py's tunnel-alone figures show for paramiko.
        "Ciphers=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com",
        "-o",
        "Compression=no",
        "-o",
        "ExitOnForwardFailure=yes",
        "-o",
        "StreamLocalBindUnlink=yes",
        "-o",
        "StreamLocalBindMask=0177",
        "-p",
        str(int(node.port)),
        "-l",
        s.user,
        node.address,
    ]


def _known_hosts_line(conns: SshConnections, node: NodeTarget, nid: str) -> str:
    pinned = (node.host_key or "").strip()
    if pinned.startswith("SHA256:"):
        # Only a fingerprint is pinned: the key paramiko's connection verified against it.
        client = tunnel._client(conns, node)  # noqa: SLF001
        transport = client.get_transport()
        if transport is None:
            raise DriverError("unreachable", f"{node.hostname}: no transport")
        key = transport.get_remote_server_key()
    else:
        try:
            key = parse_key_line(pinned)
        except ValueError:
            raise DriverError(
                "host_key_mismatch",
                f"no usable pinned host key for {node.hostname}",
                permanent=True,
            ) from None
    return f"gpc-{nid} {key.get_name()} {key.get_base64()}\n"


@contextlib.contextmanager
def _locked(folder: Path, nid: str) -> Iterator[None]:
    with open(folder / f"{nid}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(argv: list[str], timeout: float, log: Path | None = None) -> int:
    # A master daemonises (-f) and keeps its stderr: a file, never a pipe we would wait on.
    with open(log or "/dev/null", "ab") as err:
        try:
            return subprocess.run(  # noqa: S603 - ssh by absolute path, our own argv
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                timeout=timeout,
                check=False,
                start_new_session=True,
            ).returncode
        except subprocess.TimeoutExpired:
            return 255


def _answers(control: Path) -> bool:
    """Whether a master listens on its control socket: a connect, where ``ssh -O check`` would
    start a process (10–20 ms on a loaded machine, in the request's path every ALIVE_SECONDS).
    A master that died leaves its socket file behind, and a connect to it is refused."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(str(control))
        except OSError:
            return False
    return True


def _no_delay(base: list[str], timeout: float, log: Path) -> None:
    """One session on the new master (``true``), so that the node's sshd turns Nagle's algorithm
    off on the connection (TCP_NODELAY): sshd does so once a session starts, never for a
    connection that only carries forwards (``-N``), whose small writes (a chat's tokens, a
    websocket's frames) then wait for the client's delayed ACK, up to 40 ms each time.
    The ssh client sets it on its own end already. A node that refuses sessions keeps the
    forwards, only slower to answer small writes."""
    _run([*base, "true"], timeout, log)


def _master(conns: SshConnections, node: NodeTarget, folder: Path, nid: str) -> None:
    """This node's master, started when none answers (its old sockets removed first)."""
    now = time.monotonic()
    with _alive_lock:
        if _alive.get(nid, 0.0) > now:
            return
    base = _args(conns, node, folder, nid)
    timeout = conns.settings.connect_timeout + 5
    if not _answers(folder / f"{nid}.ctl"):
        for stale in folder.glob(f"{nid[:8]}-*.sock"):
            stale.unlink(missing_ok=True)
        (folder / f"{nid}.ctl").unlink(missing_ok=True)
        known = folder / f"{nid}.known_hosts"
        known.write_text(_known_hosts_line(conns, node, nid))
        known.chmod(0o600)
        argv = [*base[:-1], "-M", "-N", "-f", "-o", "ControlPersist=yes", base[-1]]
        if _run(argv, timeout, folder / f"{nid}.log") != 0:
            raise DriverError(
                "unreachable",
                f"{node.hostname}: the edge's ssh master did not start (see {folder / nid}.log)",
            )
        _no_delay(base, timeout, folder / f"{nid}.log")
    with _alive_lock:
        _alive[nid] = time.monotonic() + ALIVE_SECONDS


def forward(
    conns: SshConnections, node: NodeTarget, port: int, owner: tuple[str, str], folder: Path
) -> Path:
    """The unix socket nginx connects to for ``127.0.0.1:<port>`` on ``node``, once the node says
    the port is the instance's own (``owner``: its slug and the rendered check, as
    ``tunnel.open_owned_channel``); the master and the forward are made when missing."""
    if not 0 < int(port) < 65536:
        raise DriverError("bad_identifier", f"port {port!r}", permanent=True)
    tunnel.check_owner(conns, node, port, owner)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    nid = _node_id(conns, node)
    sock = socket_path(folder, conns, node, owner[0], port)
    with _locked(folder, nid):
        _master(conns, node, folder, nid)
        if not sock.exists():
            base = _args(conns, node, folder, nid)
            spec = f"{sock}:127.0.0.1:{int(port)}"
            argv = [*base[:-1], "-O", "forward", "-L", spec, base[-1]]
            if _run(argv, conns.settings.connect_timeout + 5, folder / f"{nid}.log") != 0:
                with _alive_lock:
                    _alive.pop(nid, None)
                raise DriverError("unreachable", f"{node.hostname}: the edge's forward failed")
    return sock


def close_all(folder: Path) -> None:
    """End every master under ``folder`` (tests; a web host shutting down)."""
    for ctl in folder.glob("*.ctl"):
        _run([SSH, "-o", f"ControlPath={ctl}", "-O", "exit", "gpc"], 10.0)
        ctl.unlink(missing_ok=True)
    for sock in folder.glob("*.sock"):
        sock.unlink(missing_ok=True)
    with _alive_lock:
        _alive.clear()
