"""The SSH driver's connections: settings, host-key pinning, the connection pool, and running a
templated command with timeouts while its output is read (see ``slices.drivers.ssh``)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import math
import re
import select
import socket
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import paramiko

from slices.drivers.base import DriverError, LogFn, NodeTarget
from slices.drivers.ssh.commands import NODE_PATH, TAIL_BYTES, Arg, host_prefix, render

MAX_LINE_CHARS = 400
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class SshSettings:
    user: str = "root"
    key_file: str = ""
    connect_timeout: float = 10.0
    command_timeout: float = 600.0
    keepalive: int = 15
    pfs_root: str = "/pfs"
    asset_root: str = "/pfs/.catalogue"
    # Output lines of one command passed to the instance's log before it is summarised.
    log_lines: int = 40
    # The PATH every command runs under on a node, and the runtimes by absolute path: no command
    # name is looked up anywhere an instance could have put a file.
    node_path: str = NODE_PATH
    docker_bin: str = "/usr/bin/docker"
    enroot_bin: str = "/usr/bin/enroot"
    mpirun_bin: str = "/usr/bin/mpirun"

    @classmethod
    def from_settings(cls, settings: Any) -> SshSettings:
        return cls(
            user=str(settings.SLICES_SSH_USER),
            key_file=str(settings.SLICES_SSH_KEY_FILE or ""),
            connect_timeout=float(settings.SLICES_SSH_CONNECT_TIMEOUT),
            command_timeout=float(settings.SLICES_SSH_COMMAND_TIMEOUT),
            keepalive=int(settings.SLICES_SSH_KEEPALIVE),
            pfs_root=str(settings.SLICES_PFS_ROOT),
            asset_root=str(settings.SLICES_ASSET_ROOT),
            node_path=str(settings.SLICES_NODE_PATH),
            docker_bin=str(settings.SLICES_DOCKER_BIN),
            enroot_bin=str(settings.SLICES_ENROOT_BIN),
            mpirun_bin=str(settings.SLICES_MPIRUN_BIN),
        )


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: str  # the bounded tail (TAIL_BYTES) of each stream
    stderr: str
    seconds: float


class _Tail:
    """The last ``limit`` bytes of a stream."""

    def __init__(self, limit: int = TAIL_BYTES) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        self.buf += data
        if len(self.buf) > self.limit:
            del self.buf[: len(self.buf) - self.limit]

    def text(self) -> str:
        return self.buf.decode("utf-8", "replace")


class _LineLog:
    """Splits output into lines for the log sink: the first ``budget`` lines, then a count every
    few seconds, then the last lines at the end (so 10 MiB of output is a dozen log lines)."""

    SUMMARY_EVERY = 5.0
    PARTIAL_MAX = 4096

    def __init__(self, log: LogFn | None, budget: int, prefix: str) -> None:
        self.log = log
        self.budget = budget
        self.prefix = prefix
        self.partial = b""
        self.sent = 0
        self.dropped = 0
        self.last_summary = time.monotonic()
        self.recent: list[str] = []

    def feed(self, data: bytes) -> None:
        if self.log is None:
            return
        chunk = self.partial + data
        lines = re.split(rb"\r\n|\r|\n", chunk)
        self.partial = lines.pop()
        if len(self.partial) > self.PARTIAL_MAX:
            lines.append(self.partial)
            self.partial = b""
        for raw in lines:
            self._line(raw)

    def _line(self, raw: bytes) -> None:
        text = _ANSI.sub("", raw.decode("utf-8", "replace")).rstrip()
        if not text:
            return
        text = text[:MAX_LINE_CHARS]
        if self.sent < self.budget:
            self.sent += 1
            self._emit(text)
            return
        self.dropped += 1
        self.recent = [*self.recent[-4:], text]
        now = time.monotonic()
        if now - self.last_summary >= self.SUMMARY_EVERY:
            self.last_summary = now
            self._emit(f"… {self.dropped} more line(s) of output so far")

    def close(self) -> None:
        if self.log is None:
            return
        if self.partial:
            self._line(self.partial)
            self.partial = b""
        if self.dropped:
            self._emit(f"… {self.dropped} line(s) of output not shown; the last ones:")
            for text in self.recent:
                self._emit(text)

    def _emit(self, text: str) -> None:
        assert self.log is not None
        self.log(f"{self.prefix}{text}")


# ---------------------------------------------------------------------------------------------
# Host keys
# ---------------------------------------------------------------------------------------------


class HostKeyRefused(paramiko.SSHException):
    """The node presented a key that is not the pinned one."""


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a public key (``SHA256:<base64, unpadded>``)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def parse_key_line(line: str) -> paramiko.PKey:
    """A public key from an OpenSSH line (``ssh-ed25519 AAAA... [comment]``)."""
    parts = line.split()
    if len(parts) < 2:
        raise ValueError("not a public key line")
    try:
        return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1], validate=True))
    except (binascii.Error, paramiko.SSHException, ValueError) as exc:
        raise ValueError(f"not a public key line: {exc}") from None


class PinnedFingerprintPolicy(paramiko.RejectPolicy):
    """Reject every key but the one whose SHA256 fingerprint is pinned (no trust on first use)."""

    def __init__(self, pinned: str) -> None:
        self.pinned = pinned

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if fingerprint(key) == self.pinned:
            return
        raise HostKeyRefused(f"{hostname} presented {fingerprint(key)}, not the pinned key")


class RefuseUnknownPolicy(paramiko.RejectPolicy):
    """RejectPolicy with its own exception type, so the refusal is told apart from a network
    error (paramiko's RejectPolicy raises a bare SSHException)."""

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        raise HostKeyRefused(
            f"{hostname} presented a {key.get_name()} key {fingerprint(key)}, not the pinned key"
        )


def pin_host_key(client: paramiko.SSHClient, node: NodeTarget) -> None:
    """Configure ``client`` to accept only ``node``'s pinned key."""
    pinned = (node.host_key or "").strip()
    if not pinned:
        raise DriverError(
            "host_key_mismatch",
            f"no host key is pinned for {node.hostname} in the inventory; refusing to connect",
            permanent=True,
        )
    if pinned.startswith("SHA256:"):
        client.set_missing_host_key_policy(PinnedFingerprintPolicy(pinned))
        return
    try:
        key = parse_key_line(pinned)
    except ValueError:
        raise DriverError(
            "host_key_mismatch",
            f"the pinned host key of {node.hostname} is neither a key line nor a SHA256 fingerprint",
            permanent=True,
        ) from None
    name = node.address if node.port == 22 else f"[{node.address}]:{node.port}"
    client.get_host_keys().add(name, key.get_name(), key)
    client.set_missing_host_key_policy(RefuseUnknownPolicy())


# ---------------------------------------------------------------------------------------------
# Connections
# ---------------------------------------------------------------------------------------------

IDLE_SECONDS = 60.0
_PoolKey = tuple[str, str, int, str]


class _ConnectionPool:
    """Open connections between one node's steps (a step takes it, gives it back when done)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[_PoolKey, tuple[paramiko.SSHClient, float]] = {}

    def take(self, key: _PoolKey) -> paramiko.SSHClient | None:
        stale: list[paramiko.SSHClient] = []
        now = time.monotonic()
        with self._lock:
            for k, (client, since) in list(self._idle.items()):
                if now - since > IDLE_SECONDS:
                    stale.append(client)
                    del self._idle[k]
            found = self._idle.pop(key, None)
        for client in stale:
            client.close()
        if found is None:
            return None
        client = found[0]
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            client.close()
            return None
        return client

    def give(self, key: _PoolKey, client: paramiko.SSHClient) -> None:
        with self._lock:
            old = self._idle.pop(key, None)
            self._idle[key] = (client, time.monotonic())
        if old is not None and old[0] is not client:
            old[0].close()

    def close_all(self) -> None:
        with self._lock:
            clients = [c for c, _ in self._idle.values()]
            self._idle.clear()
        for client in clients:
            client.close()


class SshConnections:
    """One driver's connections to the nodes and the commands it runs over them."""

    def __init__(self, settings: SshSettings) -> None:
        self.settings = settings
        self._pkey: paramiko.PKey | None = None
        self._lock = threading.Lock()
        self._pool = _ConnectionPool()
        weakref.finalize(self, self._pool.close_all)

    def _private_key(self) -> paramiko.PKey:
        with self._lock:
            if self._pkey is None:
                path = self.settings.key_file
                if not path:
                    raise DriverError(
                        "ssh_key_missing",
                        "SLICES_SSH_KEY_FILE is not set: the console has no key to log in with",
                        permanent=True,
                    )
                try:
                    self._pkey = paramiko.PKey.from_path(path)
                except (OSError, paramiko.SSHException, ValueError) as exc:
                    # The path and the error class only: never the file's content.
                    raise DriverError(
                        "ssh_key_missing",
                        f"the console's SSH key {path} cannot be loaded ({type(exc).__name__})",
                        permanent=True,
                    ) from None
            return self._pkey

    def _connect(self, node: NodeTarget) -> paramiko.SSHClient:
        timeout = self.settings.connect_timeout
        client = paramiko.SSHClient()
        try:
            pin_host_key(client, node)
            sock = _open_socket(node.address, node.port, timeout)
            client.connect(
                node.address,
                port=node.port,
                sock=sock,
                username=self.settings.user,
                pkey=self._private_key(),
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                channel_timeout=timeout,
                allow_agent=False,
                look_for_keys=False,
            )
        except DriverError:
            client.close()
            raise
        except (paramiko.BadHostKeyException, HostKeyRefused) as exc:
            client.close()
            raise DriverError(
                "host_key_mismatch",
                f"{node.hostname} ({node.address}:{node.port}) presented a host key that does not "
                f"match the inventory; refused before authentication ({exc})",
                permanent=True,
            ) from None
        except paramiko.AuthenticationException:
            client.close()
            raise DriverError(
                "unreachable",
                f"{node.hostname} ({node.address}:{node.port}) refused the console's key for "
                f"{self.settings.user}",
                permanent=True,
            ) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            client.close()
            raise DriverError(
                "unreachable",
                f"{node.hostname} ({node.address}:{node.port}): {type(exc).__name__}: {exc}"[:300],
            ) from None
        transport = client.get_transport()
        if transport is not None and self.settings.keepalive > 0:
            transport.set_keepalive(self.settings.keepalive)
            _tcp_keepalive(transport.sock, self.settings.keepalive)
        return client

    @contextmanager
    def session(self, node: NodeTarget, *, last: bool = False) -> Iterator[paramiko.SSHClient]:
        """A connection to ``node``: the one an earlier step of this driver left open if it is
        still alive, else a new one (host key checked again). Kept for the node's next step
        unless ``last`` or the step failed; idle ones are closed after ``IDLE_SECONDS`` and all
        of them when the driver is dropped (``weakref.finalize``), so none outlives its use."""
        key = (node.hostname, node.address, node.port, node.host_key)
        client = self._pool.take(key)
        if client is None:
            client = self._connect(node)
        keep = False
        try:
            yield client
            keep = not last
        finally:
            if keep:
                self._pool.give(key, client)
            else:
                client.close()

    def close(self) -> None:
        """Close every connection this driver holds (it may be used again afterwards)."""
        self._pool.close_all()

    # -- running commands -------------------------------------------------------------------
    def host_command(self, script: str) -> str:
        """``script`` under the node's fixed PATH (every command the driver sends starts so)."""
        return host_prefix(self.settings.node_path) + script

    def run(
        self,
        client: paramiko.SSHClient,
        node: NodeTarget,
        template: str,
        *,
        timeout: float | None = None,
        log: LogFn | None = None,
        check: bool = True,
        **args: Arg,
    ) -> CommandResult:
        """Run ``render(template, **args)`` on the node under ``timeout`` (default: the command
        timeout), reading stdout and stderr as they come. Raises ``command_timeout`` if it does
        not finish in time and ``command_failed`` on a non-zero exit when ``check``."""
        return self.run_script(
            client, node, render(template, **args), timeout=timeout, log=log, check=check
        )

    def run_script(
        self,
        client: paramiko.SSHClient,
        node: NodeTarget,
        script: str,
        *,
        timeout: float | None = None,
        log: LogFn | None = None,
        check: bool = True,
    ) -> CommandResult:
        """Run an already rendered script (see ``run``)."""
        limit = float(timeout if timeout is not None else self.settings.command_timeout)
        # The node enforces the limit too (and kills the command); our deadline covers the link.
        remote = self.host_command(
            render(
                "timeout -k 5 {secs} sh -c {script}", secs=max(1, math.ceil(limit)), script=script
            )
        )
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise DriverError("unreachable", f"{node.hostname}: the connection was lost")
        started = time.monotonic()
        deadline = started + limit
        try:
            chan = transport.open_session(timeout=self.settings.connect_timeout)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise DriverError(
                "unreachable", f"{node.hostname}: {type(exc).__name__}: {exc}"
            ) from None
        out, err = _Tail(), _Tail()
        lines_out = _LineLog(log, self.settings.log_lines, "")
        lines_err = _LineLog(log, self.settings.log_lines, "")
        try:
            chan.exec_command(remote)  # noqa: S601 - a fixed template, every argument shlex-quoted
            chan.shutdown_write()
            while True:
                while chan.recv_ready():
                    data = chan.recv(65536)
                    out.feed(data)
                    lines_out.feed(data)
                while chan.recv_stderr_ready():
                    data = chan.recv_stderr(65536)
                    err.feed(data)
                    lines_err.feed(data)
                remaining = deadline - time.monotonic()
                if chan.eof_received and not chan.recv_ready() and not chan.recv_stderr_ready():
                    if chan.status_event.wait(max(0.0, remaining)):
                        break
                    remaining = 0
                if remaining <= 0:
                    raise DriverError(
                        "command_timeout",
                        f"{node.hostname}: a command did not finish within {limit:g} s",
                    )
                if not transport.is_active():
                    raise DriverError(
                        "unreachable", f"{node.hostname}: the connection dropped during a command"
                    )
                select.select([chan], [], [], min(1.0, remaining))
            status = chan.recv_exit_status()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise DriverError(
                "unreachable", f"{node.hostname}: {type(exc).__name__}: {exc}"[:300]
            ) from None
        finally:
            lines_out.close()
            lines_err.close()
            chan.close()
        result = CommandResult(status, out.text(), err.text(), time.monotonic() - started)
        if status == 124:
            raise DriverError(
                "command_timeout", f"{node.hostname}: a command did not finish within {limit:g} s"
            )
        if check and status != 0:
            raise DriverError(
                "command_failed",
                f"{node.hostname}: exit status {status}: {result.stderr.strip()[-500:]}",
            )
        return result

    def run_on(
        self,
        node: NodeTarget,
        template: str,
        args: Mapping[str, Arg],
        *,
        last: bool = False,
        timeout: float | None = None,
        log: LogFn | None = None,
        check: bool = True,
    ) -> CommandResult:
        """``run`` on a ``session(node, last=last)`` of its own: a step that is one command."""
        with self.session(node, last=last) as client:
            return self.run_script(
                client, node, render(template, **args), timeout=timeout, log=log, check=check
            )

    def execute(
        self, node: NodeTarget, template: str, *, timeout: float | None = None, **args: Arg
    ) -> CommandResult:
        """Connect, run one templated command, disconnect (tools and tests)."""
        return self.run_on(node, template, args, last=True, timeout=timeout, check=False)

    def write_files(
        self,
        client: paramiko.SSHClient,
        directory: str,
        files: Sequence[tuple[str, str | bytes, int]],
    ) -> None:
        """Create ``directory`` (and its parents, mode 700) and write each (path, content, mode)
        in it over one SFTP session: no shell involved; each file replaced atomically."""
        try:
            sftp = client.open_sftp()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise DriverError("unreachable", f"SFTP: {type(exc).__name__}: {exc}") from None
        current = ""
        try:
            channel = sftp.get_channel()
            if channel is not None:
                channel.settimeout(self.settings.command_timeout)
            for part in directory.strip("/").split("/"):
                current = f"{current}/{part}"
                try:
                    sftp.stat(current)
                except FileNotFoundError:
                    sftp.mkdir(current, 0o700)
            for path, text, mode in files:
                current = path
                tmp = f"{path}.tmp"
                data = text if isinstance(text, bytes) else text.encode()
                sftp.putfo(io.BytesIO(data), tmp)
                sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, path)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise DriverError("command_failed", f"writing {current}: {exc}") from None
        finally:
            sftp.close()


class _QuickAckSocket(socket.socket):
    """The console's TCP connection to a node. Interactive traffic crosses it (a terminal's
    keystrokes, a proxied app's streamed answer): sshd leaves Nagle's algorithm on for a
    connection without a PTY, so each small packet it sends after the first waits for this
    side's acknowledgement, which Linux delays up to ~40 ms. Acknowledging at once after each
    read (TCP_QUICKACK, which the kernel clears again by itself) removes that wait; this side
    sends without delay (TCP_NODELAY)."""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        if _QUICKACK is not None:
            with contextlib.suppress(OSError):
                self.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        return data


_QUICKACK = getattr(socket, "TCP_QUICKACK", None)


def _open_socket(address: str, port: int, timeout: float) -> socket.socket:
    """A connected ``_QuickAckSocket`` to ``address:port`` (the first address that answers)."""
    last: OSError | None = None
    for family, kind, proto, _name, where in socket.getaddrinfo(
        address, port, type=socket.SOCK_STREAM
    ):
        sock = _QuickAckSocket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(where)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last or OSError(f"no address for {address}")


def _tcp_keepalive(sock: Any, seconds: int) -> None:
    """Notice a silently dropped connection within about ``seconds`` × 2: paramiko's keepalive
    sends without asking for a reply, so the kernel is told to give up on a peer that stops
    acknowledging (idle probes, and a bound on unacknowledged data)."""
    if not isinstance(sock, socket.socket):
        return
    options = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), seconds),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), max(1, seconds // 3)),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), 3),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), seconds * 2000),
    ]
    for level, option, value in options:
        if option is None:
            continue
        try:
            sock.setsockopt(level, option, value)
        except OSError:
            continue
