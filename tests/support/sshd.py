"""Real SSH test hosts: Debian's OpenSSH server, one process per host on a loopback port.

Each host has its own generated ed25519 host key, its own ``AuthorizedKeysFile`` holding the
client key generated for the run, and its own node directory; it runs as root (the suite does)
with ``UsePAM no`` and ``StrictModes no``, its pid file and config in its own directory.

    pool = SshHostPool(tmp_dir)        # or the session fixture ``ssh_hosts`` below
    hosts = pool.get(8)                # started on first use, reused afterwards
    configure_ssh_fleet(settings, hosts, nodes, tmp_path)   # point Node rows at them
    pool.stop()

The bench imports this module before Django is set up, so Django is imported inside the helper
that needs it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SSHD = "/usr/sbin/sshd"
ADDRESS = "127.0.0.1"
START_TIMEOUT = 15.0

SSHD_CONFIG = """\
Port {port}
ListenAddress {address}
HostKey {dir}/ssh_host_ed25519_key
AuthorizedKeysFile {dir}/authorized_keys
PidFile {dir}/sshd.pid
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AllowUsers root
UseDNS no
Subsystem sftp internal-sftp
MaxStartups 256
MaxSessions 64
LogLevel INFO
# The development machine's root ~/.bashrc (pyenv init: ~0.3 s a command) is not part of a node:
# bash sources it for sshd's commands only at SHLVL 0, so start them at 1.
SetEnv SHLVL=1
"""


def sshd_available() -> bool:
    return os.access(SSHD, os.X_OK) and os.geteuid() == 0


def generate_key(path: Path, comment: str) -> str:
    """Write an ed25519 private key (OpenSSH format, mode 600) and return its public key line."""
    key = Ed25519PrivateKey.generate()
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    line = f"{public.decode()} {comment}"
    Path(f"{path}.pub").write_text(line + "\n")
    return line


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((ADDRESS, 0))
        return int(sock.getsockname()[1])


def wait_for_banner(port: int, deadline: float, process: subprocess.Popen[bytes] | None) -> None:
    """Until the port answers with an SSH banner (or the server died, or the deadline passed)."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"sshd on port {port} exited with {process.returncode}")
        try:
            with socket.create_connection((ADDRESS, port), timeout=1.0) as sock:
                sock.settimeout(2.0)
                if sock.recv(64).startswith(b"SSH-"):
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise RuntimeError(f"sshd on port {port} did not answer with a banner ({last})")


def start_sshd(
    directory: Path, config_for: Callable[[int], str]
) -> tuple[int, subprocess.Popen[bytes]]:
    """Start sshd with the config ``config_for(port)`` on a free loopback port (another one when
    the port was taken meanwhile, up to 5 tries); its log in ``directory/sshd.log``."""
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    for _attempt in range(5):
        port = _free_port()
        config = directory / "sshd_config"
        config.write_text(config_for(port))
        with open(directory / "sshd.log", "ab") as errors:
            process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(config), "-p", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=errors,
                stderr=errors,
            )
        try:
            wait_for_banner(port, time.monotonic() + START_TIMEOUT, process)
        except RuntimeError:
            if process.poll() is None:
                process.kill()
            process.wait()
            continue
        return port, process
    log = (directory / "sshd.log").read_text(errors="replace")[-2000:]
    raise RuntimeError(f"could not start sshd in {directory}: {log}")


def process_alive(pid: int) -> bool:
    """A process a test host started (they all run on this machine): running, not a zombie (this
    container's init may not reap orphans)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    state = next(line for line in status.splitlines() if line.startswith("State:"))
    return "Z" not in state.split()[1]


def processes_under(path: Path) -> list[int]:
    """Processes whose command line names ``path``, or that work in a directory under it (what a
    test's instances started on the test hosts under its own directory: a per-instance sshd
    daemonises, so it outlives the session that started it; an AI app's server runs from the
    checkout in the instance's directory)."""
    needle = str(path).encode()
    root = str(path.resolve())
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            named = needle in (entry / "cmdline").read_bytes()
            cwd = "" if named else os.readlink(entry / "cwd")
            inside = named or cwd == root or cwd.startswith(root + os.sep)
            if inside and process_alive(int(entry.name)):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def stop_pids(pids: list[int], grace: float = 3.0) -> list[int]:
    """TERM, then KILL after ``grace`` seconds: the pids still alive after that."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [p for p in pids if process_alive(p)]
        if not pids:
            break
    return pids


def stop_processes_under(path: Path, grace: float = 3.0) -> int:
    """Stop every process of ``processes_under(path)``; how many were still alive after."""
    return len(stop_pids(processes_under(path), grace))


# What stands between a bare-process launch's recorded pid and the workload: ``unshare`` (the
# instance's PID namespace), ``xargs -0`` (its init) and ``env -i`` until they exec.
_LAUNCHERS = {"unshare", "xargs", "env"}


def _exe(pid: int) -> str:
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).name
    except OSError:
        return ""


def _first_child(pid: int) -> int | None:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return None
    return int(children[0]) if children else None


def workload_pid(pid: int, timeout: float = 5.0) -> int:
    """The instance's own process under a bare-process launch's recorded ``pid`` (the driver's
    ``unshare`` launcher, whose child ``xargs -0`` is the instance's PID namespace's init and
    runs it as its one child with exactly the instance's environment: ``env -i ... <command>``):
    the first process down that line that is none of them any more."""
    deadline = time.monotonic() + timeout
    while True:
        child = _first_child(pid)
        while child is not None and _exe(child) in _LAUNCHERS:
            child = _first_child(child)
        if child is not None and _exe(child):
            return child
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} started no workload")
        time.sleep(0.02)


def instance_namespace(launcher: int) -> str:
    """The PID namespace of a bare-process instance (``pid:[inode]``): its launcher's child's."""
    child = _first_child(launcher)
    assert child is not None, f"launcher {launcher} has no child"
    return os.readlink(f"/proc/{child}/ns/pid")


def namespace_members(namespace: str) -> list[int]:
    """Every live process (as this machine numbers them) in the PID namespace ``namespace``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "pid") == namespace and process_alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def host_pid(namespace: str, inner: int) -> int:
    """The pid this machine gives the process that is ``inner`` inside ``namespace`` (what
    ``echo $$`` says in the instance's terminal)."""
    for pid in namespace_members(namespace):
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{pid}/status").read_text()
            nspid = next(ln for ln in status.splitlines() if ln.startswith("NSpid:")).split()
            if nspid[-1] == str(inner):
                return pid
    raise AssertionError(f"no process {inner} in {namespace}")


@dataclass
class SshHost:
    index: int
    port: int
    directory: Path  # config, keys, pid file, log
    node_dir: Path  # the host's own node directory (a default workdir)
    host_key_line: str
    process: subprocess.Popen[bytes]
    address: str = ADDRESS

    @property
    def host_key_file(self) -> Path:
        return self.directory / "ssh_host_ed25519_key"

    def log_text(self) -> str:
        """What the server logged (INFO: one "Accepted publickey" line per login)."""
        return (self.directory / "sshd.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


@dataclass
class SshHostPool:
    """Test hosts started on demand and kept for reuse (one pool per test session)."""

    base: Path
    hosts: list[SshHost] = field(default_factory=list)
    client_key: Path = field(init=False)
    client_public: str = field(init=False)

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.client_key = self.base / "console_ed25519"
        self.client_public = generate_key(self.client_key, "console@tests")
        self._lock = threading.Lock()

    def get(self, count: int) -> list[SshHost]:
        """The first ``count`` hosts, starting the missing ones (in parallel)."""
        with self._lock:
            missing = range(len(self.hosts), count)
            if missing:
                with ThreadPoolExecutor(max_workers=8) as pool:
                    self.hosts.extend(pool.map(self._start, missing))
            return self.hosts[:count]

    def _start(self, index: int) -> SshHost:
        directory = self.base / f"host{index:02d}"
        node_dir = directory / "node"
        node_dir.mkdir(parents=True, exist_ok=True)
        host_key_line = generate_key(directory / "ssh_host_ed25519_key", f"host{index}")
        (directory / "authorized_keys").write_text(self.client_public + "\n")
        port, process = start_sshd(
            directory, lambda port: SSHD_CONFIG.format(port=port, address=ADDRESS, dir=directory)
        )
        return SshHost(index, port, directory, node_dir, host_key_line, process)

    def stop(self) -> None:
        for host in self.hosts:
            host.stop()
        self.hosts.clear()


_shared: SshHostPool | None = None


@pytest.fixture(scope="session")
def ssh_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshHostPool]:
    """The session's SSH test hosts: ``ssh_hosts.get(n)``. One pool per session even when
    several test modules import this fixture."""
    global _shared
    if not sshd_available():
        pytest.fail(f"the SSH tests need {SSHD} (Debian's openssh-server) and root")
    owner = _shared is None
    if _shared is None:
        _shared = SshHostPool(tmp_path_factory.mktemp("sshd"))
    try:
        yield _shared
    finally:
        if owner:
            _shared.stop()
            _shared = None


@dataclass(frozen=True)
class SshFleet:
    """Where a test fleet's nodes point after ``configure_ssh_fleet``."""

    pfs_root: Path
    asset_root: Path
    workdirs: dict[str, Path]  # hostname -> the node's own workdir


def configure_ssh_fleet(
    settings: Any,
    hosts: Sequence[SshHost],
    nodes: Sequence[Any],
    root: Path,
    *,
    client_key: Path,
) -> SshFleet:
    """Point ``nodes`` (Node rows) at ``hosts`` (round robin when there are fewer hosts than
    nodes: each node still gets its own workdir) and switch ``settings`` to the ssh driver."""
    from slices.models import Node  # Django is set up by now (the bench imports this module first)

    pfs_root = root / "pfs"
    asset_root = root / "assets"
    pfs_root.mkdir(parents=True, exist_ok=True)
    asset_root.mkdir(parents=True, exist_ok=True)
    workdirs: dict[str, Path] = {}
    for i, node in enumerate(nodes):
        host = hosts[i % len(hosts)]
        workdir = root / "nodes" / node.hostname
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        workdirs[node.hostname] = workdir
        # A bare process on a test host: single-tenant, the only place the driver allows it
        # beside other instances (slices.drivers.ssh: runtime_not_isolating).
        layout = {
            **(node.layout or {}),
            "runtime": "process",
            "single_tenant": True,
            "workdir": str(workdir),
        }
        Node.objects.filter(pk=node.pk).update(
            address=host.address,
            ssh_port=host.port,
            host_key_fingerprint=host.host_key_line,
            layout=layout,
        )
    settings.SLICES_DRIVER = "ssh"
    settings.SLICES_SSH_USER = "root"
    settings.SLICES_SSH_KEY_FILE = str(client_key)
    settings.SLICES_PFS_ROOT = str(pfs_root)
    settings.SLICES_ASSET_ROOT = str(asset_root)
    return SshFleet(pfs_root, asset_root, workdirs)


# ---------------------------------------------------------------------------------------------
# A region's SSH gateway (issue 19): a real sshd whose jump user's keys file the console writes
# ---------------------------------------------------------------------------------------------

# The jump user: an unprivileged account every Debian has, with no usable shell (the gateway
# only forwards). sshd reads its keys file as that user, so the file lies in a directory it can
# traverse (not the suite's tmp directories, which are root's only).
GATEWAY_USER = "nobody"
GATEWAY_SSHD_CONFIG = """\
Port {port}
ListenAddress {address}
HostKey {dir}/ssh_host_ed25519_key
AuthorizedKeysFile {dir}/authorized_keys
PidFile {dir}/sshd.pid
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AllowUsers root {user}
UseDNS no
Subsystem sftp internal-sftp
LogLevel INFO
SetEnv SHLVL=1
Match User {user}
    AuthorizedKeysFile {keys_file}
    AllowTcpForwarding local
    PermitTTY no
    X11Forwarding no
    AllowAgentForwarding no
    PermitTunnel no
    GatewayPorts no
    ForceCommand /bin/false
"""


@dataclass
class SshGateway:
    """A gateway test host: ``host`` (its management login is the console's key as root, like a
    node's) and the jump user's keys file, which only the console writes."""

    host: SshHost
    keys_file: Path
    user: str = GATEWAY_USER

    def keys_text(self) -> str:
        return self.keys_file.read_text() if self.keys_file.exists() else ""

    def stop(self) -> None:
        self.host.stop()
        shutil.rmtree(self.keys_file.parent, ignore_errors=True)


def start_gateway(pool: SshHostPool, name: str = "gateway") -> SshGateway:
    """A gateway sshd on a loopback port, its management key the pool's client key."""
    import tempfile

    directory = pool.base / name
    directory.mkdir(parents=True, exist_ok=True)
    host_key_line = generate_key(directory / "ssh_host_ed25519_key", name)
    (directory / "authorized_keys").write_text(pool.client_public + "\n")
    keys_dir = Path(tempfile.mkdtemp(prefix="gpc-gateway-"))
    keys_dir.chmod(0o755)
    keys_file = keys_dir / "authorized_keys"
    keys_file.write_text("")
    keys_file.chmod(0o644)
    port, process = start_sshd(
        directory,
        lambda port: GATEWAY_SSHD_CONFIG.format(
            port=port, address=ADDRESS, dir=directory, user=GATEWAY_USER, keys_file=keys_file
        ),
    )
    host = SshHost(-1, port, directory, directory, host_key_line, process)
    return SshGateway(host, keys_file)


def configure_ssh_gateway(gateway: SshGateway, region: Any) -> Any:
    """Point ``region``'s Gateway row at the gateway test host (public and management address
    alike: the loopback), as the fleet file's ``gateway:`` block would."""
    from slices.models import Gateway

    row, _created = Gateway.objects.update_or_create(
        region=region,
        defaults={
            "host": gateway.host.address,
            "port": gateway.host.port,
            "user": gateway.user,
            "address": gateway.host.address,
            "ssh_port": gateway.host.port,
            "host_key_fingerprint": gateway.host.host_key_line,
            "keys_file": str(gateway.keys_file),
        },
    )
    return row
