"""The ssh node driver against real sshd test hosts (Debian's OpenSSH on loopback ports).

No database: the driver gets dataclasses in and gives dataclasses out.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from slices.drivers import get_driver
from slices.drivers.base import DriverError, InstanceSpec, Mount, NodeTarget
from slices.drivers.ssh import (
    NO_GPU_DRIVER,
    TAIL_BYTES,
    SshDriver,
    SshSettings,
    fingerprint,
    parse_all_reduce_perf,
    parse_key_line,
    render,
)
from tests.support.sshd import (  # noqa: F401
    SshHost,
    SshHostPool,
    generate_key,
    process_alive,
    ssh_hosts,
    workload_pid,
)

SLUG = "gpc-0a1b2c3d"
# Every shell metacharacter the brief names and payloads that would leave a marker. (A line
# break is refused: no runtime's environment format carries one; see the test below.)
HOSTILE = "; $(touch {m}) `touch {m}` | touch {m} & touch {m} ' \" \\ touch {m}"


class Logs(list[str]):
    def __call__(self, line: str) -> None:
        self.append(line)


@pytest.fixture
def host(ssh_hosts: SshHostPool) -> SshHost:  # noqa: F811
    return ssh_hosts.get(1)[0]


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    paths = {k: tmp_path / k for k in ("node", "pfs", "assets")}
    for p in paths.values():
        p.mkdir()
    return paths


def make_driver(pool: SshHostPool, roots: dict[str, Path], **kw: object) -> SshDriver:
    options: dict[str, object] = {
        "key_file": str(pool.client_key),
        "pfs_root": str(roots["pfs"]),
        "asset_root": str(roots["assets"]),
        "connect_timeout": 5.0,
        "command_timeout": 30.0,
        **kw,
    }
    return SshDriver(SshSettings(**options))  # type: ignore[arg-type]


def make_node(
    host: SshHost, workdir: Path, *, host_key: str | None = None, rank: int = 0
) -> NodeTarget:
    return NodeTarget(
        hostname=f"test-n{rank:02d}",
        address=host.address,
        port=host.port,
        host_key=host.host_key_line if host_key is None else host_key,
        rank=rank,
        gpus=(0, 1, 2, 3),
        workdir=str(workdir),
        runtime="process",
        single_tenant=True,
    )


@pytest.fixture
def driver(ssh_hosts: SshHostPool, roots: dict[str, Path]) -> SshDriver:  # noqa: F811
    """The driver with the test settings (the key every test host accepts)."""
    return make_driver(ssh_hosts, roots)


@pytest.fixture
def node(host: SshHost, roots: dict[str, Path]) -> NodeTarget:
    """The test host pinned by its real host key, working in ``roots["node"]``."""
    return make_node(host, roots["node"])


def make_spec(nodes: tuple[NodeTarget, ...], **kw: object) -> InstanceSpec:
    fields: dict[str, object] = {
        "instance_id": "6f1c7a52-0000-4000-8000-000000000001",
        "slug": SLUG,
        "name": "my box",
        "owner": "a1b2c3d4-owner",
        "image": "",
        "entrypoint": "",
        "env": {},
        "mounts": (),
        "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOr0test alice@laptop",
        "nodes": nodes,
        "gpus_per_node": 4,
        **kw,
    }
    return InstanceSpec(**fields)  # type: ignore[arg-type]


def instance_dir(workdir: Path) -> Path:
    return workdir / "instances" / SLUG


def logins(host: SshHost) -> int:
    return host.log_text().count("Accepted publickey")


# ---------------------------------------------------------------------------------------------
# Commands are templates with every argument quoted
# ---------------------------------------------------------------------------------------------


def test_render_quotes_every_argument() -> None:
    assert render("echo {a}", a="x; rm -rf /") == "echo 'x; rm -rf /'"
    assert render("ls -- {p}", p=["a b", "$(c)", "d"]) == "ls -- 'a b' '$(c)' d"
    assert render("kill {n}", n=42) == "kill 42"


def test_all_reduce_perf_output_is_parsed() -> None:
    sample = """\
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    31.42    0.00    0.00      0    30.87    0.00    0.00      0
  4294967296    1073741824     float     sum      -1    45210   95.00  188.40      0    45102   95.23  188.85      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 94.1234
"""
    assert parse_all_reduce_perf(sample) == {"busbw_gbps": 94.1234, "latency_us": 31.42}
    assert parse_all_reduce_perf("mpirun: command not found") is None


# ---------------------------------------------------------------------------------------------
# Connecting: pinned host keys
# ---------------------------------------------------------------------------------------------


def test_connect_logs_in_with_the_pinned_key_line(
    driver: SshDriver, node: NodeTarget, host: SshHost
) -> None:
    logs = Logs()
    result = driver.connect(make_spec((node,)), node, logs)
    assert result.data["uid"] == "0"
    pinned = fingerprint(parse_key_line(host.host_key_line))
    assert any(pinned in line and "matches the pinned key" in line for line in logs)


def test_a_pinned_sha256_fingerprint_is_accepted(
    driver: SshDriver, host: SshHost, roots: dict[str, Path]
) -> None:
    pinned = fingerprint(parse_key_line(host.host_key_line))
    assert pinned.startswith("SHA256:")
    node = make_node(host, roots["node"], host_key=pinned)
    assert driver.connect(make_spec((node,)), node, Logs()).data["uid"]


@pytest.mark.parametrize("pin", ["changed-key-line", "changed-fingerprint", "nothing-pinned"])
def test_an_unknown_or_changed_host_key_is_refused_before_any_command(
    driver: SshDriver,
    host: SshHost,
    roots: dict[str, Path],
    tmp_path: Path,
    pin: str,
) -> None:
    other = generate_key(tmp_path / "impostor", "impostor")
    pinned = {
        "changed-key-line": other,
        "changed-fingerprint": fingerprint(parse_key_line(other)),
        "nothing-pinned": "",
    }[pin]
    node = make_node(host, roots["node"], host_key=pinned)
    marker = tmp_path / "ran"
    before = logins(host)

    with pytest.raises(DriverError) as refused:
        driver.execute(node, "touch {m}", m=str(marker))
    assert refused.value.code == "host_key_mismatch"
    assert refused.value.permanent
    with pytest.raises(DriverError) as refused_step:
        driver.prepare(make_spec((node,)), node, Logs())
    assert refused_step.value.code == "host_key_mismatch"

    assert not marker.exists()
    assert not instance_dir(roots["node"]).exists()
    # Refused before authentication: the server never saw the console log in.
    assert logins(host) == before
    # The same host with its real key pinned does log in (the count above would move).
    driver.execute(make_node(host, roots["node"]), "true")
    assert logins(host) == before + 1


def test_a_key_the_node_does_not_accept_is_a_permanent_failure(
    ssh_hosts: SshHostPool,  # noqa: F811
    node: NodeTarget,
    roots: dict[str, Path],
    tmp_path: Path,
) -> None:
    generate_key(tmp_path / "stranger", "stranger")
    driver = make_driver(ssh_hosts, roots, key_file=str(tmp_path / "stranger"))
    with pytest.raises(DriverError) as failed:
        driver.connect(make_spec((node,)), node, Logs())
    assert failed.value.code == "unreachable"
    assert failed.value.permanent
    assert "refused the console's key" in failed.value.detail


def test_a_closed_port_is_unreachable_and_transient(
    ssh_hosts: SshHostPool,  # noqa: F811
    host: SshHost,
    roots: dict[str, Path],
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once closed
    node = NodeTarget(
        "gone", "127.0.0.1", port, host.host_key_line, 0, (0,), str(roots["node"]), "process"
    )
    with pytest.raises(DriverError) as failed:
        make_driver(ssh_hosts, roots, connect_timeout=1.0).connect(make_spec((node,)), node, Logs())
    assert failed.value.code == "unreachable"
    assert not failed.value.permanent


def test_a_port_that_sends_no_banner_fails_within_the_connect_timeout(
    ssh_hosts: SshHostPool,  # noqa: F811
    host: SshHost,
    roots: dict[str, Path],
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:  # accept and say nothing
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    node = NodeTarget(
        "mute", "127.0.0.1", port, host.host_key_line, 0, (0,), str(roots["node"]), "process"
    )
    started = time.monotonic()
    try:
        with pytest.raises(DriverError) as failed:
            make_driver(ssh_hosts, roots, connect_timeout=1.0).connect(
                make_spec((node,)), node, Logs()
            )
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        listener.close()
    assert failed.value.code == "unreachable"
    assert not failed.value.permanent
    assert accepted, "the driver did reach the silent port"
    # Bounded by our 1 s banner timeout, not paramiko's 15 s default nor forever.
    assert time.monotonic() - started < 10


# ---------------------------------------------------------------------------------------------
# Commands: hung, large output
# ---------------------------------------------------------------------------------------------


def test_a_hung_command_times_out_and_is_killed_on_the_node(
    driver: SshDriver, node: NodeTarget, tmp_path: Path
) -> None:
    started = time.monotonic()
    with pytest.raises(DriverError) as failed:
        driver.execute(node, "sleep {n}; touch {m}", n="47.25", m=str(tmp_path / "late"), timeout=1)
    assert failed.value.code == "command_timeout"
    assert time.monotonic() - started < 47, "it waited for the command instead of its timeout"

    def sleeping() -> list[int]:
        return [
            int(p)
            for p in os.listdir("/proc")
            if p.isdigit() and _cmdline(int(p)) == b"sleep\x0047.25\x00" and process_alive(int(p))
        ]

    deadline = time.monotonic() + 20
    while sleeping() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not sleeping(), "the hung command was left running on the node"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_ten_mib_of_stdout_and_stderr_completes_with_a_bounded_tail_and_log(
    driver: SshDriver, node: NodeTarget
) -> None:
    logs = Logs()
    with driver.session(node) as client:
        result = driver.run(
            client,
            node,
            "yes {o} | head -n {n}; yes {e} | head -n {n} >&2; echo done",
            o="out-line",
            e="err-line",
            n=5 * 1024 * 1024 // len("out-line\n"),  # 5 MiB on each stream
            log=logs,
        )
    assert result.exit_status == 0
    assert result.stdout.endswith("done\n")
    assert len(result.stdout.encode()) == TAIL_BYTES
    assert len(result.stderr.encode()) == TAIL_BYTES
    assert result.stderr.endswith("err-line\n")
    # ~1.2 million lines of output reach the log as a few dozen, with the last ones.
    assert 40 <= len(logs) < 200
    assert any("not shown" in line for line in logs)
    assert "done" in logs


# ---------------------------------------------------------------------------------------------
# The steps on a node
# ---------------------------------------------------------------------------------------------


def run_steps(driver: SshDriver, spec: InstanceSpec, node: NodeTarget, logs: Logs) -> None:
    for step in (driver.connect, driver.prepare, driver.mount, driver.start, driver.health):
        step(spec, node, logs)


def test_hostile_text_reaches_the_node_literally_and_runs_nothing(
    ssh_hosts: SshHostPool,  # noqa: F811
    driver: SshDriver,
    node: NodeTarget,
    roots: dict[str, Path],
    tmp_path: Path,
) -> None:
    marker = tmp_path / "pwned"
    hostile = HOSTILE.format(m=marker)
    secret = "s3cret-token-do-not-log"
    (roots["assets"] / "models" / "org" / "tiny").mkdir(parents=True)
    spec = make_spec(
        (node,),
        name=f"box{hostile}",
        env={"USER_NOTE": hostile, "EMPTY": "", "JUPYTER_TOKEN": secret},
        mounts=(Mount("/pfs/public/models/org/tiny", "/models/tiny"),),
    )
    logs = Logs()
    run_steps(driver, spec, node, logs)

    root = instance_dir(roots["node"])
    pid = workload_pid(int((root / "pid").read_text()))
    environ = dict(
        item.split(b"=", 1)
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if b"=" in item
    )
    assert environ[b"USER_NOTE"] == hostile.encode()
    assert environ[b"INSTANCE_NAME"] == f"box{hostile}".encode()
    assert environ[b"EMPTY"] == b""
    assert environ[b"NODE_RANK"] == b"0"
    assert environ[b"CUDA_VISIBLE_DEVICES"] == b"0,1,2,3"
    assert not marker.exists()
    # The user's text and secrets stay out of the log; the private key never appears.
    key_body = ssh_hosts.client_key.read_text().splitlines()[1]
    for line in logs:
        assert secret not in line and "pwned" not in line and key_body not in line
    driver.teardown(spec, node, logs)
    assert not marker.exists()


@pytest.mark.parametrize(
    "env",
    [
        {"NOTE": "first line\ntouch {m}"},
        {"NOTE": "carriage\rreturn"},
        {"A\n": "x"},
        {"PATH": "{m}:/usr/bin:/bin"},
        {"LD_PRELOAD": "{m}"},
    ],
)
def test_an_environment_no_runtime_can_carry_as_data_is_refused_before_anything_is_written(
    driver: SshDriver, node: NodeTarget, roots: dict[str, Path], tmp_path: Path, env: dict
) -> None:
    marker = tmp_path / "pwned"
    spec = make_spec((node,), env={k: v.format(m=marker) for k, v in env.items()})
    with pytest.raises(DriverError) as refused:
        driver.prepare(spec, node, Logs())
    assert refused.value.code == "bad_environment" and refused.value.permanent
    assert not instance_dir(roots["node"]).exists()
    assert not marker.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("slug", "gpc-1; touch {m}"),
        ("slug", "gpc-1\n"),
        ("owner", "../../etc"),
        ("mount_target", "/models/x; touch {m}"),
        ("mount_source", "/pfs/public/../../../etc"),
        ("workdir", "/tmp/$(touch {m})"),
    ],
)
def test_identifiers_outside_the_allow_list_are_refused_up_front(
    driver: SshDriver,
    node: NodeTarget,
    tmp_path: Path,
    field: str,
    value: str,
) -> None:
    marker = tmp_path / "pwned"
    value = value.format(m=marker)
    spec = make_spec((node,))
    if field == "slug":
        spec = make_spec((node,), slug=value)
    elif field == "owner":
        spec = make_spec((node,), owner=value)
    elif field == "mount_target":
        spec = make_spec((node,), mounts=(Mount("models/a/b", value),))
    elif field == "mount_source":
        spec = make_spec((node,), mounts=(Mount(value, "/models/b"),))
    else:
        node = NodeTarget(
            node.hostname, node.address, node.port, node.host_key, 0, (0,), value, "process"
        )
        spec = make_spec((node,))
    with pytest.raises(DriverError) as refused:
        driver.prepare(spec, node, Logs())
        driver.mount(spec, node, Logs())
    assert refused.value.code == "bad_identifier"
    assert refused.value.permanent
    assert not marker.exists()


def test_provisioning_steps_write_the_job_environment_and_start_idempotently(
    ssh_hosts: SshHostPool,  # noqa: F811
    roots: dict[str, Path],
    tmp_path: Path,
) -> None:
    hosts = ssh_hosts.get(2)
    workdirs = [tmp_path / "w0", tmp_path / "w1"]
    nodes = tuple(
        make_node(h, w, rank=i) for i, (h, w) in enumerate(zip(hosts, workdirs, strict=True))
    )
    (roots["assets"] / "datasets" / "org" / "set").mkdir(parents=True)
    spec = make_spec(
        nodes,
        mounts=(Mount("/pfs/public/datasets/org/set", "/datasets/set"),),
        partition_key=0x8123,
    )
    driver = make_driver(ssh_hosts, roots)
    logs = Logs()
    assert driver.isolate(spec, logs).data == {"partition_key": 0x8123, "enforced": False}
    before = logins(hosts[0])
    for node in nodes:
        run_steps(driver, spec, node, logs)
    assert NO_GPU_DRIVER in logs
    # One login per node for its five steps.
    assert logins(hosts[0]) == before + 1

    for rank, workdir in enumerate(workdirs):
        root = instance_dir(workdir)
        env = (root / "environment").read_text()
        assert f"NODE_RANK={rank}\n" in env
        assert "MASTER_ADDR=127.0.0.1\n" in env
        assert "WORLD_SIZE=8\n" in env
        assert "NCCL_IB_PKEY=33059\n" in env
        assert (root / "hostfile").read_text() == "127.0.0.1 slots=4\n127.0.0.1 slots=4\n"
        assert (root / "authorized_keys").read_text() == spec.ssh_public_key + "\n"
        assert (root / "authorized_keys").stat().st_mode & 0o777 == 0o600
        assert os.readlink(root / "pfs") == str(roots["pfs"] / spec.owner)
        assert (roots["pfs"] / spec.owner).is_dir()
        assert os.readlink(root / "datasets" / "set") == str(roots["assets"] / "datasets/org/set")

    first = instance_dir(workdirs[0])
    pid = int((first / "pid").read_text())
    assert process_alive(pid)
    # Starting again reuses the running process: one per instance on a node.
    again = Logs()
    assert driver.start(spec, nodes[0], again).data == {"reused": True}
    assert int((first / "pid").read_text()) == pid

    measured = driver.allreduce_check(spec, logs)
    assert measured.data == {"measured": False, "why": "no GPUs on the test hosts"}

    for node in nodes:
        driver.teardown(spec, node, logs)
    # The first node's connection stayed open for the all-reduce check (starting again used it
    # too), which closed it; teardown logged in again.
    assert logins(hosts[0]) == before + 2
    assert not process_alive(pid)
    assert not first.exists()
    # The PFS behind the link is untouched; teardown again is a no-op.
    assert (roots["pfs"] / spec.owner).is_dir()
    driver.teardown(spec, nodes[0], logs)


def test_a_missing_asset_fails_the_mount_permanently(driver: SshDriver, node: NodeTarget) -> None:
    spec = make_spec((node,), mounts=(Mount("/pfs/public/models/org/absent", "/models/absent"),))
    driver.prepare(spec, node, Logs())
    with pytest.raises(DriverError) as failed:
        driver.mount(spec, node, Logs())
    assert failed.value.code == "asset_missing"
    assert failed.value.permanent


def test_health_fails_when_the_process_has_exited(
    driver: SshDriver, node: NodeTarget, roots: dict[str, Path]
) -> None:
    spec = make_spec((node,), entrypoint="echo starting up; exit 3")
    for step in (driver.prepare, driver.mount, driver.start):
        step(spec, node, Logs())
    pid = int((instance_dir(roots["node"]) / "pid").read_text())
    deadline = time.monotonic() + 10
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(DriverError) as failed:
        driver.health(spec, node, Logs())
    assert failed.value.code == "not_running"
    assert "starting up" in failed.value.detail
    driver.teardown(spec, node, Logs())


def test_a_dropped_connection_between_steps_is_replaced_and_keepalives_are_on(
    ssh_hosts: SshHostPool,  # noqa: F811
    node: NodeTarget,
    host: SshHost,
    roots: dict[str, Path],
) -> None:
    driver = make_driver(ssh_hosts, roots, keepalive=6)
    spec = make_spec((node,))
    before = logins(host)
    with driver.session(node) as client:  # kept for the node's next step
        transport = client.get_transport()
        assert transport is not None
        sock = transport.sock
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 12_000
    driver.connect(spec, node, Logs())
    assert logins(host) == before + 1  # the step reused the open connection
    sock.shutdown(socket.SHUT_RDWR)  # the link drops under the idle connection
    deadline = time.monotonic() + 10
    while transport.is_active() and time.monotonic() < deadline:
        time.sleep(0.05)
    driver.prepare(spec, node, Logs())
    assert logins(host) == before + 2  # a new connection, host key checked again
    assert (instance_dir(roots["node"]) / "environment").exists()
    driver.close()


def test_get_driver_builds_the_ssh_driver_from_settings(settings) -> None:  # noqa: ANN001
    settings.SLICES_SSH_USER = "gpc"
    settings.SLICES_SSH_KEY_FILE = "/etc/gpu-console/id_ed25519"
    settings.SLICES_SSH_COMMAND_TIMEOUT = 42
    settings.SLICES_PFS_ROOT = "/mnt/pfs"
    driver = get_driver("ssh")
    assert isinstance(driver, SshDriver)
    assert (driver.name, driver.simulated) == ("ssh", False)
    assert driver.settings.user == "gpc"
    assert driver.settings.key_file == "/etc/gpu-console/id_ed25519"
    assert driver.settings.command_timeout == 42.0
    assert driver.settings.pfs_root == "/mnt/pfs"
