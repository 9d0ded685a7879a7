"""The real node driver: SSH (paramiko) to each node; one connection carries a node's steps.

Trust and injection, the two things a driver that runs commands as root must get right:

- Host keys are pinned from the inventory (``Node.host_key_fingerprint``: a full public key line
  or its ``SHA256:`` fingerprint) with paramiko's ``RejectPolicy``; a node that presents any other
  key, unknown or changed, is refused after the key exchange and before authentication, so no
  credential is offered and no command runs (``host_key_mismatch``, permanent). There is no
  trust-on-first-use.
- Every remote command is one of the fixed templates below, filled by ``render``, which
  ``shlex.quote``s each argument; identifiers that name things on the node (the instance's slug,
  the owner's id, paths, the image) must also match an allow-list pattern up front. Files (the
  hostfile, the environment, authorized_keys) are written with SFTP, never through a shell. The
  user's free text (the instance name, environment values) only ever reaches the node inside the
  environment file, quoted, and is never logged.

Bounded: connect, banner, authentication and channel-open each have the connect timeout; every
command runs under ``timeout`` on the node and a deadline here; keepalives (SSH and TCP) notice
a dropped connection. The connection a node's first step opens is kept for its next steps and
closed after the last one (health, teardown), when idle, or when the driver is dropped. Output (stdout and stderr) is read while the command runs, so a command writing
megabytes cannot fill a window and deadlock; a bounded tail is kept for error messages and only a
rate-limited number of lines reaches the instance's log.

Each node's instance lives in ``<workdir>/instances/<slug>/``: ``env.sh`` (sourced, ``export
NAME='value'``), ``docker.env`` (the names only: docker and enroot take the values from the
sourced environment, so values may hold any byte but NUL, newlines included), ``hostfile``,
``authorized_keys``, ``pid`` and ``output.log`` for a process, and on ``runtime=process`` the
links ``pfs`` and the asset mount points. A container or process is named after the slug, so
every step is idempotent: starting twice reuses what the first start made.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
import posixpath
import re
import select
import shlex
import socket
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import paramiko

from slices.drivers.base import (
    ENV_NAME,
    DriverError,
    InstanceSpec,
    LogFn,
    NodeTarget,
    StepResult,
    WorkloadOutput,
)

# Rough expectations per step on one node (for the ETA); a docker start includes the image pull.
STEP_SECONDS: dict[str, float] = {
    "isolate": 0.1,
    "connect": 1.0,
    "prepare": 1.0,
    "mount": 1.0,
    "start": 30.0,
    "health": 2.0,
    "allreduce": 60.0,
    "teardown": 5.0,
}

RUNTIMES = ("docker", "enroot", "process")

# Allow-lists for what names things on a node (everything is quoted as well).
SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
OWNER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+@-]{0,1023}$")
SAFE_RELATIVE = re.compile(r"^[A-Za-z0-9._+@-][A-Za-z0-9._/+@-]{0,1023}$")
IMAGE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$")
# Where the marketplace says assets live (marketplace.mounts.PFS_PUBLIC_ROOT); on the node they
# are found under SLICES_ASSET_ROOT.
ASSET_PREFIX = "/pfs/public/"

TAIL_BYTES = 64 * 1024
MAX_LINE_CHARS = 400
NO_GPU_DRIVER = "no NVIDIA driver on this test host: GPU check skipped"
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
        )


# ---------------------------------------------------------------------------------------------
# Commands: fixed templates, every argument quoted
# ---------------------------------------------------------------------------------------------

Arg = str | int | Sequence[str]


def render(template: str, **args: Arg) -> str:
    """Fill ``template``'s ``{name}`` fields, each argument ``shlex.quote``d (a sequence becomes
    its items, each quoted, separated by spaces). Nothing else is ever interpolated."""
    quoted: dict[str, str] = {}
    for key, value in args.items():
        if isinstance(value, str | int):
            quoted[key] = shlex.quote(str(value))
        else:
            quoted[key] = " ".join(shlex.quote(str(v)) for v in value)
    return template.format(**quoted)


# A process is alive unless it is gone or a zombie (an unreaped child of a dead parent).
_ALIVE = 'alive() {{ kill -0 "$1" 2>/dev/null && ! grep -qs "^State:[[:space:]]*Z" "/proc/$1/status"; }}; '
_PID_ALIVE = (
    _ALIVE + 'p=$(cat {pid} 2>/dev/null); case "$p" in ""|*[!0-9]*) false;; *) alive "$p";; esac'
)

CMD_ID = "id -u"
CMD_MOUNT_CHECK = (
    "mkdir -p -- {pfs} && for p in {sources}; do "
    '[ -e "$p" ] || {{ echo "missing: $p" >&2; exit 3; }}; done'
)
# Pairs of (source, link): refuse to replace anything that is not already a link.
CMD_LINK = (
    "set -- {pairs}; while [ $# -gt 1 ]; do "
    'if [ -e "$2" ] && [ ! -L "$2" ]; then echo "not a link: $2" >&2; exit 4; fi; '
    'mkdir -p -- "$(dirname -- "$2")" && ln -sfn -- "$1" "$2" || exit 1; shift 2; done'
)
CMD_START_PROCESS = (
    _PID_ALIVE + " && {{ echo reused; exit 0; }}; cd {root} || exit 1; "
    "( set -a; . {env}; set +a; exec setsid {argv} ) </dev/null >>{output} 2>&1 & "
    'echo $! > {pid}; echo "started pid $!"'
)
CMD_START_DOCKER = (
    "set -a; . {env}; set +a; "
    "if docker container inspect {name} >/dev/null 2>&1; then "
    "docker start {name} >/dev/null && echo reused; else "
    'ib=""; [ -d /dev/infiniband ] && ib="--device=/dev/infiniband --cap-add=IPC_LOCK"; '
    "docker run -d --name {name} --gpus {gpus} --network host --ipc host "
    "--ulimit memlock=-1:-1 --ulimit stack=67108864 $ib --env-file {env_names} {volumes} "
    "{image} {command}; fi"
)
CMD_START_ENROOT = (
    _PID_ALIVE + " && {{ echo reused; exit 0; }}; cd {root} || exit 1; "
    "set -a; . {env}; set +a; "
    "[ -f {squashfs} ] || enroot import -o {squashfs} {image_uri} || exit 1; "
    "enroot list | grep -qx {name} || enroot create --name {name} {squashfs} || exit 1; "
    "( exec setsid enroot start --rw {mounts} {envs} {name} {command} ) "
    "</dev/null >>{output} 2>&1 & "
    'echo $! > {pid}; echo "started pid $!"'
)
CMD_PROCESS_ALIVE = (
    _PID_ALIVE + ' || {{ echo "not running" >&2; tail -n 20 {output} >&2; exit 5; }}'
)
CMD_GPUS_HOST = "if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; else echo {none}; fi"
CMD_PROCESS_HEALTH = CMD_PROCESS_ALIVE + "; " + CMD_GPUS_HOST
CMD_DOCKER_HEALTH = (
    "s=$(docker container inspect --format {fmt} {name} 2>&1); "
    '[ "$s" = true ] || {{ echo "container {name}: $s" >&2; exit 5; }}; '
    "docker exec {name} nvidia-smi -L"
)
CMD_TOOLS = 'for t in {tools}; do command -v "$t" >/dev/null 2>&1 && echo "$t"; done; true'
CMD_ALLREDUCE = (
    "set -a; . {env}; set +a; mpirun --allow-run-as-root --hostfile {hostfile} -np {ranks} "
    "-x MASTER_ADDR -x NCCL_IB_HCA -x NCCL_SOCKET_IFNAME -x NCCL_IB_PKEY "
    "all_reduce_perf -b 8 -e 4G -f 2 -g 1"
)
CMD_STOP_PROCESS = (
    _ALIVE + 'p=$(cat {pid} 2>/dev/null); case "$p" in ""|*[!0-9]*) ;; *) '
    'kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null; i=0; '
    'while alive "$p" && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; '
    'kill -KILL -- "-$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; echo "stopped pid $p";; esac; '
    "rm -f -- {pid}"
)
# The workload's output from line {start} on, at most {lines} lines / {bytes} bytes; then whether
# it still runs (a process's pid, a container's state).
CMD_READ_OUTPUT = (
    "tail -n +{start} {output} 2>/dev/null | head -n {lines} | head -c {bytes}; "
    + _PID_ALIVE
    + " || echo __exited__ >&2"
)
CMD_READ_DOCKER_OUTPUT = (
    "docker logs {name} 2>&1 | tail -n +{start} | head -n {lines} | head -c {bytes}; "
    's=$(docker container inspect --format {fmt} {name} 2>&1); [ "$s" = true ] || echo __exited__ >&2'
)
CMD_STOP_DOCKER = "docker rm -f {name} >/dev/null 2>&1; true"
CMD_STOP_ENROOT = CMD_STOP_PROCESS + "; enroot remove -f {name} >/dev/null 2>&1; true"
# Links first (rm never follows them into the PFS), then the instance's directory.
CMD_REMOVE = 'for l in {links}; do [ -L "$l" ] && rm -f -- "$l"; done; rm -rf -- {root}; true'


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
# The driver
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


@dataclass(frozen=True)
class _Paths:
    root: str  # <workdir>/instances/<slug>

    @property
    def env(self) -> str:
        return f"{self.root}/env.sh"

    @property
    def env_names(self) -> str:
        return f"{self.root}/docker.env"

    @property
    def hostfile(self) -> str:
        return f"{self.root}/hostfile"

    @property
    def authorized_keys(self) -> str:
        return f"{self.root}/authorized_keys"

    @property
    def pid(self) -> str:
        return f"{self.root}/pid"

    @property
    def log(self) -> str:
        return f"{self.root}/output.log"

    @property
    def pfs(self) -> str:
        return f"{self.root}/pfs"

    @property
    def squashfs(self) -> str:
        return f"{self.root}/image.sqsh"

    def inside(self, target: str) -> str:
        return f"{self.root}/{target.lstrip('/')}"


def _clean_abs(path: str, what: str) -> str:
    norm = posixpath.normpath(path or "")
    if not SAFE_PATH.match(norm) or ".." in norm.split("/") or norm != path.rstrip("/"):
        raise DriverError(
            "bad_identifier", f"{what} {path!r} is not an acceptable path", permanent=True
        )
    return norm


def env_file(env: dict[str, str]) -> str:
    """``export NAME='value'`` lines, each value ``shlex.quote``d: sourcing it sets exactly these
    values (newlines and quotes included) and runs nothing."""
    lines = []
    for name, value in env.items():
        if not ENV_NAME.match(name):
            raise DriverError("bad_identifier", f"environment name {name[:64]!r}", permanent=True)
        if "\x00" in value:
            raise DriverError("bad_identifier", f"the value of {name} contains NUL", permanent=True)
        lines.append(f"export {name}={shlex.quote(value)}\n")
    return "".join(lines)


class SshDriver:
    name = "ssh"
    simulated = False

    def __init__(self, settings: SshSettings) -> None:
        self.settings = settings
        self._pkey: paramiko.PKey | None = None
        self._lock = threading.Lock()
        self._pool = _ConnectionPool()
        weakref.finalize(self, self._pool.close_all)

    def step_seconds(self) -> dict[str, float]:
        return dict(STEP_SECONDS)

    # -- connections ------------------------------------------------------------------------
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
            client.connect(
                node.address,
                port=node.port,
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
        remote = render(
            "timeout -k 5 {secs} sh -c {script}", secs=max(1, math.ceil(limit)), script=script
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

    def execute(
        self, node: NodeTarget, template: str, *, timeout: float | None = None, **args: Arg
    ) -> CommandResult:
        """Connect, run one templated command, disconnect (tools and tests)."""
        with self.session(node, last=True) as client:
            return self.run_script(
                client, node, render(template, **args), timeout=timeout, check=False
            )

    def write_files(
        self,
        client: paramiko.SSHClient,
        directory: str,
        files: Sequence[tuple[str, str, int]],
    ) -> None:
        """Create ``directory`` (and its parents, mode 700) and write each (path, text, mode) in
        it over one SFTP session: no shell involved; each file replaced atomically."""
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
                sftp.putfo(io.BytesIO(text.encode()), tmp)
                sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, path)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise DriverError("command_failed", f"writing {current}: {exc}") from None
        finally:
            sftp.close()

    # -- what a step needs ------------------------------------------------------------------
    def _paths(self, spec: InstanceSpec, node: NodeTarget) -> _Paths:
        if not SLUG.match(spec.slug):
            raise DriverError("bad_identifier", f"instance slug {spec.slug!r}", permanent=True)
        workdir = _clean_abs(node.workdir, "the node's workdir")
        return _Paths(f"{workdir}/instances/{spec.slug}")

    def _runtime(self, node: NodeTarget) -> str:
        if node.runtime not in RUNTIMES:
            raise DriverError(
                "bad_identifier",
                f"{node.hostname}: unknown container runtime {node.runtime!r}",
                permanent=True,
            )
        return node.runtime

    def _pfs_source(self, spec: InstanceSpec) -> str:
        if not OWNER.match(spec.owner):
            raise DriverError("bad_identifier", f"owner id {spec.owner!r}", permanent=True)
        return f"{_clean_abs(self.settings.pfs_root, 'SLICES_PFS_ROOT')}/{spec.owner}"

    def _asset_mounts(self, spec: InstanceSpec) -> list[tuple[str, str]]:
        """(source on the node, target in the instance) for each marketplace asset."""
        root = _clean_abs(self.settings.asset_root, "SLICES_ASSET_ROOT")
        pairs = []
        for mount in spec.mounts:
            rel = mount.source
            if rel.startswith(ASSET_PREFIX):
                rel = rel[len(ASSET_PREFIX) :]
            rel = rel.lstrip("/")
            norm = posixpath.normpath(rel) if rel else ""
            if not SAFE_RELATIVE.match(norm) or ".." in norm.split("/"):
                raise DriverError("bad_identifier", f"asset path {mount.source!r}", permanent=True)
            target = _clean_abs(mount.target, "mount target")
            if target in ("/", "/pfs") or target.startswith("/pfs/"):
                raise DriverError("bad_identifier", f"mount target {target!r}", permanent=True)
            pairs.append((f"{root}/{norm}", target))
        return pairs

    def _node_env(self, spec: InstanceSpec, node: NodeTarget) -> dict[str, str]:
        env = spec.job_env(node)
        if node.runtime in ("process", "enroot") and node.gpus:
            # No container to hide the node's other GPUs: point CUDA (and enroot's hook) at ours.
            devices = ",".join(str(g) for g in node.gpus)
            env.setdefault("CUDA_VISIBLE_DEVICES", devices)
            env.setdefault("NVIDIA_VISIBLE_DEVICES", devices)
        return env

    def _where(self, node: NodeTarget) -> str:
        return f"{self.settings.user}@{node.address}:{node.port}"

    # -- steps -----------------------------------------------------------------------------
    def isolate(self, spec: InstanceSpec, log: LogFn) -> StepResult:
        if spec.partition_key is None:
            log("single host: no fabric partition needed")
        else:
            log(
                f"no fabric manager (UFM) is configured for the ssh driver: partition key "
                f"{spec.partition_key:#06x} is recorded by the console and set as NCCL_IB_PKEY on "
                f"the {len(spec.nodes)} node(s), not enforced on the switches"
            )
        return StepResult({"partition_key": spec.partition_key, "enforced": False})

    def connect(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        with self.session(node) as client:
            transport = client.get_transport()
            key = transport.get_remote_server_key() if transport is not None else None
            result = self.run(client, node, CMD_ID, timeout=self.settings.connect_timeout, log=None)
        uid = result.stdout.strip()
        log(
            f"ssh {self._where(node)}: host key {fingerprint(key) if key else '?'} matches the "
            f"pinned key; logged in (uid {uid})"
        )
        return StepResult({"uid": uid})

    def prepare(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        paths = self._paths(spec, node)
        self._runtime(node)
        env = self._node_env(spec, node)
        body = env_file(env)
        with self.session(node) as client:
            self.write_files(
                client,
                paths.root,
                [
                    (paths.authorized_keys, _authorized_keys(spec), 0o600),
                    (paths.hostfile, spec.hostfile(), 0o644),
                    (paths.env, body, 0o600),
                    (paths.env_names, "".join(f"{k}\n" for k in env), 0o600),
                ],
            )
        log(f"created {paths.root}")
        log(
            f"wrote the hostfile ({len(spec.nodes)} node(s)) and the environment "
            f"(NODE_RANK={node.rank}, MASTER_ADDR={spec.master_addr}, {len(env)} variables)"
        )
        return StepResult({"dir": paths.root})

    def mount(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        paths = self._paths(spec, node)
        runtime = self._runtime(node)
        pfs = self._pfs_source(spec)
        assets = self._asset_mounts(spec)
        pairs: list[str] = [pfs, paths.pfs]
        for src, target in assets:
            pairs += [src, paths.inside(target)]
        with self.session(node) as client:
            result = self.run(
                client,
                node,
                # On runtime=process the links are made in the same command; a container runtime
                # bind-mounts the same sources when it starts.
                CMD_MOUNT_CHECK + (" && " + CMD_LINK if runtime == "process" else ""),
                pfs=pfs,
                sources=[src for src, _ in assets],
                pairs=pairs,
                log=log,
                check=False,
            )
            if result.exit_status == 3:
                raise DriverError(
                    "asset_missing",
                    f"{node.hostname}: {result.stderr.strip()[-300:]} is not on the parallel "
                    "file system",
                    permanent=True,
                )
            if result.exit_status != 0:
                raise DriverError(
                    "command_failed", f"{node.hostname}: {result.stderr.strip()[-300:]}"
                )
        where = "linked" if runtime == "process" else "bind-mounted when the container starts"
        log(f"parallel file system {pfs} {where} at /pfs")
        for src, target in assets:
            log(f"{src} {where} read-only at {target}")
        return StepResult({"mounts": len(assets) + 1})

    def start(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        paths = self._paths(spec, node)
        runtime = self._runtime(node)
        if spec.image and not IMAGE_REF.match(spec.image):
            raise DriverError("bad_identifier", f"image {spec.image!r}", permanent=True)
        # The entrypoint is catalogue data (the image's launch template), never user input; it is
        # run by a shell so that its ${VARIABLES} expand from the instance's environment.
        command = ["sh", "-c", spec.entrypoint] if spec.entrypoint else []
        with self.session(node) as client:
            if runtime == "process":
                result = self.run(
                    client,
                    node,
                    CMD_START_PROCESS,
                    pid=paths.pid,
                    root=paths.root,
                    env=paths.env,
                    output=paths.log,
                    argv=command or ["sleep", "infinity"],
                )
            elif runtime == "docker":
                if not spec.image:
                    raise DriverError(
                        "no_image",
                        f"{node.hostname} runs docker: an image is needed",
                        permanent=True,
                    )
                volumes = ["-v", f"{self._pfs_source(spec)}:/pfs"]
                volumes += ["-v", f"{paths.authorized_keys}:/root/.ssh/authorized_keys:ro"]
                volumes += ["-v", f"{paths.hostfile}:/etc/gpc/hostfile:ro"]
                for src, target in self._asset_mounts(spec):
                    volumes += ["-v", f"{src}:{target}:ro"]
                result = self.run(
                    client,
                    node,
                    CMD_START_DOCKER,
                    log=log,
                    env=paths.env,
                    name=spec.slug,
                    # Only this instance's GPUs (a host may be shared); all of them on a whole node.
                    gpus='"device=' + ",".join(str(g) for g in node.gpus) + '"'
                    if node.gpus
                    else "all",
                    env_names=paths.env_names,
                    volumes=volumes,
                    image=spec.image,
                    command=command,
                )
            else:
                if not spec.image:
                    raise DriverError(
                        "no_image",
                        f"{node.hostname} runs enroot: an image is needed",
                        permanent=True,
                    )
                mounts = ["--mount", f"{self._pfs_source(spec)} /pfs none x-create=dir,bind"]
                for src, target in self._asset_mounts(spec):
                    mounts += ["--mount", f"{src} {target} none x-create=dir,bind,ro"]
                envs: list[str] = []
                for name in self._node_env(spec, node):
                    envs += ["--env", name]
                result = self.run(
                    client,
                    node,
                    CMD_START_ENROOT,
                    pid=paths.pid,
                    root=paths.root,
                    env=paths.env,
                    output=paths.log,
                    squashfs=paths.squashfs,
                    image_uri=f"docker://{spec.image}",
                    name=spec.slug,
                    mounts=mounts,
                    envs=envs,
                    command=command,
                )
        reused = "reused" in result.stdout
        what = {"process": "process", "docker": "container", "enroot": "enroot container"}[runtime]
        log(
            f"{what} {spec.slug} already running: reused"
            if reused
            else f"started {what} {spec.slug} ({spec.image or 'bare host'}) with "
            f"{len(node.gpus)} GPU(s)"
        )
        return StepResult({"reused": reused})

    def health(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        paths = self._paths(spec, node)
        runtime = self._runtime(node)
        # The last provisioning step on a node: its connection is not kept, except the first
        # node's of a slice, which the all-reduce check uses next.
        first_of_slice = len(spec.nodes) > 1 and node == spec.nodes[0]
        with self.session(node, last=not first_of_slice) as client:
            if runtime == "docker":
                gpus = self.run(
                    client,
                    node,
                    CMD_DOCKER_HEALTH,
                    fmt="{{.State.Running}}",
                    name=spec.slug,
                    check=False,
                )
            else:
                gpus = self.run(
                    client,
                    node,
                    CMD_PROCESS_HEALTH,
                    pid=paths.pid,
                    output=paths.log,
                    none="__no_nvidia_smi__",
                    check=False,
                )
        if gpus.exit_status == 5:
            raise DriverError(
                "not_running",
                f"{node.hostname}: the instance's {'container' if runtime == 'docker' else 'process'}"
                f" is not running: {gpus.stderr.strip()[-400:]}",
                permanent=True,
            )
        if "__no_nvidia_smi__" in gpus.stdout:
            if runtime != "process":
                raise DriverError(
                    "gpu_missing", f"{node.hostname}: nvidia-smi is not installed", permanent=True
                )
            log(NO_GPU_DRIVER)
            log(f"{spec.slug}: process alive")
            return StepResult({"gpus_visible": None, "gpu_check": "skipped"})
        listed = [ln for ln in gpus.stdout.splitlines() if ln.startswith("GPU ")]
        indexes = {int(m.group(1)) for ln in listed if (m := re.match(r"GPU (\d+):", ln))}
        if runtime == "docker":
            ok = gpus.exit_status == 0 and len(listed) == len(node.gpus)
        else:
            ok = gpus.exit_status == 0 and set(node.gpus) <= indexes
        if not ok:
            raise DriverError(
                "gpu_missing",
                f"{node.hostname}: nvidia-smi lists {len(listed)} GPU(s); the instance has "
                f"{len(node.gpus)} ({gpus.stderr.strip()[-200:]})",
                permanent=True,
            )
        log(f"nvidia-smi: {len(node.gpus)} GPU(s) visible; {spec.slug} running")
        return StepResult({"gpus_visible": len(node.gpus)})

    def allreduce_check(self, spec: InstanceSpec, log: LogFn) -> StepResult:
        if not spec.nodes:
            return StepResult({"measured": False, "why": "no nodes"})
        first = spec.nodes[0]
        paths = self._paths(spec, first)
        with self.session(first, last=True) as client:
            tools = self.run(
                client, first, CMD_TOOLS, tools=["all_reduce_perf", "nvidia-smi"]
            ).stdout.split()
            if "all_reduce_perf" not in tools:
                why = (
                    "no GPUs on the test hosts"
                    if "nvidia-smi" not in tools
                    else f"nccl-tests' all_reduce_perf is not installed on {first.hostname}"
                )
                log(f"all-reduce check not run: {why}")
                return StepResult({"measured": False, "why": why})
            result = self.run(
                client,
                first,
                CMD_ALLREDUCE,
                log=log,
                env=paths.env,
                hostfile=paths.hostfile,
                ranks=sum(len(n.gpus) for n in spec.nodes),
                check=False,
            )
        figures = parse_all_reduce_perf(result.stdout)
        if result.exit_status != 0 or figures is None:
            why = f"all_reduce_perf failed (exit {result.exit_status})"
            log(why)
            return StepResult({"measured": False, "why": why})
        log(
            f"all_reduce_perf over {len(spec.nodes)} nodes: bus bandwidth "
            f"{figures['busbw_gbps']:.1f} GB/s, 8-byte latency {figures['latency_us']:.1f} µs"
        )
        return StepResult({"measured": True, **figures})

    def workload_output(
        self, spec: InstanceSpec, node: NodeTarget, offset: int, elapsed_s: float, limit: int
    ) -> WorkloadOutput:
        """Complete lines the instance's workload printed on ``node`` from line ``offset`` (0 =
        the first), at most ``limit``, and whether it still runs. ``elapsed_s`` is unused here."""
        paths = self._paths(spec, node)
        runtime = self._runtime(node)
        cap = TAIL_BYTES // 2
        args: dict[str, Arg] = {"start": offset + 1, "lines": max(1, limit), "bytes": cap}
        with self.session(node) as client:
            if runtime == "docker":
                result = self.run(
                    client,
                    node,
                    CMD_READ_DOCKER_OUTPUT,
                    name=spec.slug,
                    fmt="{{.State.Running}}",
                    check=False,
                    **args,
                )
            else:
                result = self.run(
                    client,
                    node,
                    CMD_READ_OUTPUT,
                    output=paths.log,
                    pid=paths.pid,
                    check=False,
                    **args,
                )
        running = "__exited__" not in result.stderr
        text = result.stdout
        parts = text.split("\n")
        if text.endswith("\n"):
            lines = parts[:-1]
        elif not running:
            lines = parts if text else []  # the workload ended: its last line is complete
        elif len(parts) > 1:
            lines = parts[:-1]  # the last line is still being written: read it next time
        elif len(text.encode()) >= cap:
            lines = [text]  # one line longer than a read: take it as it is
        else:
            lines = []
        return WorkloadOutput(lines[:limit], running)

    def teardown(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        paths = self._paths(spec, node)
        runtime = self._runtime(node)
        links = [paths.pfs] + [paths.inside(t) for _src, t in self._asset_mounts(spec)]
        with self.session(node, last=True) as client:
            if runtime == "docker":
                self.run(client, node, CMD_STOP_DOCKER, name=spec.slug, log=log)
            elif runtime == "enroot":
                self.run(client, node, CMD_STOP_ENROOT, pid=paths.pid, name=spec.slug, log=log)
            else:
                self.run(client, node, CMD_STOP_PROCESS, pid=paths.pid, log=log)
            self.run(client, node, CMD_REMOVE, links=links, root=paths.root, log=log)
        log(f"stopped {spec.slug} and removed {paths.root}")
        return StepResult()


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


def _authorized_keys(spec: InstanceSpec) -> str:
    """The instance owner's key, one line; anything that is not a single key line is dropped."""
    key = " ".join((spec.ssh_public_key or "").split())
    if not key or not re.match(r"^(ssh-|ecdsa-|sk-)[A-Za-z0-9@.-]+ [A-Za-z0-9+/=]+( .*)?$", key):
        return ""
    return key + "\n"


def parse_all_reduce_perf(text: str) -> dict[str, float] | None:
    """nccl-tests' output: the average bus bandwidth and the smallest message's time."""
    busbw = re.search(r"#\s*Avg bus bandwidth\s*:\s*([0-9.]+)", text)
    if busbw is None:
        return None
    latency = None
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0].isdigit() and len(fields) >= 8:
            try:
                latency = float(fields[5])  # out-of-place time (us) of the first (smallest) size
            except ValueError:
                continue
            break
    return {"busbw_gbps": float(busbw.group(1)), "latency_us": latency or 0.0}
