"""A slice's Slurm against REAL daemons (issue 31): Debian's Slurm 22.05 and munge (``make
system-deps``) started by the ssh driver inside the instance on the 8 sshd test hosts; the
console submits, follows, reads the output of and cancels jobs through slurmrestd over its
pinned SSH connection to rank 0. No fake on this path.

The test hosts are one machine: its 8 nodes run 8 ``slurmd -N <node>`` (one port each) and share
the slice's munged; their GPUs are stand-ins (links to /dev/null named nvidiaN).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slices import services
from slices.choices import InstanceState, JobGroup
from slices.models import Instance, InstanceEvent, Node, SlurmCluster, SlurmJob
from slices.services import slurm_jobs
from tests.slices.factories import load_small_fleet, run_order
from tests.support.sshd import (  # noqa: F401
    SshFleet,
    SshHostPool,
    configure_ssh_fleet,
    processes_under,
    ssh_hosts,
    stop_pids,
)

pytestmark = pytest.mark.django_db

HOSTS = 8
SLURM_BINARIES = (
    "/usr/sbin/slurmctld",
    "/usr/sbin/slurmd",
    "/usr/sbin/slurmrestd",
    "/usr/sbin/munged",
)


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """The slices' node-local Slurm directories: traversable (slurmrestd runs as nobody), and
    whatever a failed test left running there is stopped afterwards."""
    path = Path(tempfile.mkdtemp(prefix="gpc-slurm-"))
    path.chmod(0o755)
    yield path
    stop_pids(processes_under(path))
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fleet(settings, ssh_hosts: SshHostPool, tmp_path: Path, run_dir: Path) -> SshFleet:  # noqa: ANN001, F811
    missing = [b for b in SLURM_BINARIES if not os.access(b, os.X_OK)]
    if missing:
        pytest.fail(f"the Slurm tests need {', '.join(missing)}: run make system-deps")
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SSH_CONNECT_TIMEOUT = 5.0
    settings.SLICES_SSH_COMMAND_TIMEOUT = 60.0
    settings.SLICES_SLURM_RUN_DIR = str(run_dir)
    load_small_fleet()
    nodes = list(Node.objects.filter(cluster__code="yc-a800").order_by("hostname"))
    assert len(nodes) == HOSTS
    return configure_ssh_fleet(
        settings, ssh_hosts.get(HOSTS), nodes, tmp_path, client_key=ssh_hosts.client_key
    )


def _events(instance: Instance) -> list[str]:
    return [
        f"{e.kind}:{e.code}:{e.node}:{e.params}:{e.text[:200]}"
        for e in InstanceEvent.objects.filter(instance=instance).order_by("pk")
    ]


def _follow_until(
    instance: Instance, job: SlurmJob, want: set[str], timeout: float = 40
) -> SlurmJob:
    deadline = time.monotonic() + timeout
    while True:
        slurm_jobs.follow_jobs(instance.pk)
        job.refresh_from_db()
        if job.group in want and (job.group != JobGroup.DONE or job.output_complete):
            return job
        assert time.monotonic() < deadline, (job.group, job.slurm_state, job.reason, job.output)
        time.sleep(0.3)


def _hostnames(expression: str) -> set[str]:
    """Slurm's node list ("n[01-03,05]", "a,b") as names."""
    import re

    names: set[str] = set()
    for prefix, ranges, single in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", expression):
        if single:
            names.add(single)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            for i in range(int(low), int(high or low) + 1):
                names.add(f"{prefix}{i:0{len(low)}d}")
    return names


def _in_terminal(instance: Instance, hostname: str, command: str, until: str) -> str:
    """Type ``command`` in a web terminal on ``hostname``; what it printed once ``until`` and a
    digit appear (the typed line echoes ``until`` followed by a quote, never a digit)."""
    from slices.drivers import get_driver
    from slices.services.provisioning import build_spec

    spec = build_spec(instance)
    node = next(n for n in spec.nodes if n.hostname == hostname)
    shell = get_driver("ssh").open_shell(spec, node, 200, 40)
    said = b""
    try:
        shell.send(command.encode() + b"\n")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            chunk = shell.recv(0.5)
            if chunk is None:
                break
            said += chunk
            text = said.decode(errors="replace")
            if any(part[:1].isdigit() for part in text.split(until)[1:]):
                break
    finally:
        shell.close()
    return said.decode(errors="replace")


def test_real_slurm_starts_runs_jobs_streams_output_and_cancels(
    fleet: SshFleet, funded, django_capture_on_commit_callbacks, run_dir: Path, tmp_path: Path
) -> None:  # noqa: ANN001
    from console import services as console_services
    from tests.support.sshd import generate_key

    key = generate_key(tmp_path / "alice_key", "alice@laptop")
    console_services.add_ssh_key(funded, name="laptop", public_key=key)
    instance = run_order(funded, django_capture_on_commit_callbacks, gpu_model="A800", cards=64)
    assert instance.state == InstanceState.RUNNING, _events(instance)
    cluster = SlurmCluster.objects.get(instance=instance)
    assert cluster.started_at is not None and cluster.api_version == "v0.0.38"

    # The files: from the allocation, keys as root's own and nobody else's.
    slurm_dir = run_dir / instance.slug
    conf = (slurm_dir / "slurm.conf").read_text()
    hostnames = list(instance.nodes.order_by("rank").values_list("hostname", flat=True))
    for name in hostnames:
        assert f"NodeName={name} NodeAddr=127.0.0.1 " in conf
    assert conf.count("Gres=gpu:a800:8") == 8
    assert "SwitchName=" in (slurm_dir / "topology.conf").read_text()
    for key, size in (("munge.key", 1024), ("jwt.key", 64)):
        info = (slurm_dir / key).stat()
        assert stat.S_IMODE(info.st_mode) == 0o400 and info.st_uid == 0 and info.st_size == size
    assert (slurm_dir / key).read_bytes() == bytes(cluster.jwt_key)
    # The instance's environment points sbatch/srun/sinfo at it.
    root = fleet.workdirs[hostnames[0]] / "instances" / instance.slug
    assert f"SLURM_CONF={slurm_dir}/slurm.conf" in (root / "environment").read_text()

    # A 2-node job: the environment is data (no shell evaluates it), every node gets its GPUs.
    script = (
        "#!/bin/bash\n"
        "srun -N 2 bash -c 'echo node=$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES'\n"
        'echo "greeting=$GREETING"\n'
    )
    with django_capture_on_commit_callbacks(execute=True):
        job = slurm_jobs.submit_job(
            instance,
            funded,
            {"script": script, "name": "hello", "nodes": 2, "gpus_per_node": 8,
             "time_limit": 5, "environment": {"GREETING": "hi $(touch /tmp/pwned)"}},
        )  # fmt: skip
    assert job.slurm_id is not None
    job = _follow_until(instance, job, {JobGroup.DONE})
    assert job.slurm_state == "COMPLETED" and job.exit_code == 0, job.output
    lines = job.output.splitlines()
    assert lines[-1] == "greeting=hi $(touch /tmp/pwned)"
    nodes = sorted(line.split()[0] for line in lines if line.startswith("node="))
    assert len(nodes) == 2 and all(n[len("node=") :] in hostnames for n in nodes)
    assert all(line.endswith("gpus=0,1,2,3,4,5,6,7") for line in lines if line.startswith("node="))
    assert job.started_at is not None and job.ended_at is not None
    assert InstanceEvent.objects.filter(instance=instance, code="job_ended").count() == 1

    # A long job runs; one that needs the whole slice waits for it, with Slurm's reason; cancel.
    long_job = slurm_jobs.submit_job(
        instance, funded,
        {"script": "#!/bin/bash\necho started\nsleep 300\n", "name": "long", "nodes": 2},
    )  # fmt: skip
    long_job = _follow_until(instance, long_job, {JobGroup.RUNNING})
    wide = slurm_jobs.submit_job(
        instance, funded, {"script": "#!/bin/bash\nhostname\n", "name": "wide", "nodes": 8}
    )
    slurm_jobs.refresh_queue(instance)
    wide.refresh_from_db()
    assert wide.group == JobGroup.QUEUED and wide.reason in ("Resources", "None", "Priority")
    slurm_jobs.cancel_job(long_job, funded)
    long_job = _follow_until(instance, long_job, {JobGroup.DONE})
    assert long_job.slurm_state == "CANCELLED"
    assert "started" in long_job.output
    wide = _follow_until(instance, wide, {JobGroup.DONE})
    assert wide.slurm_state == "COMPLETED"

    # In the web terminal (a shell in the instance on a node) Slurm's commands work, and a job
    # submitted there with sbatch shows up in the console's queue at the next refresh.
    said = _in_terminal(
        instance,
        hostnames[3],
        "sinfo -h -N | wc -l | sed 's/^/NODES=/'; "
        "sbatch --parsable -J from-terminal --wrap true | sed 's/^/JOB=/'",
        "JOB=",
    )
    assert "NODES=8" in said, said
    terminal_id = int(said.split("JOB=")[-1].split()[0])
    # Over SSH to the instance's own sshd on a node, as a customer logs in: the same.
    import paramiko

    part = instance.nodes.get(rank=5)
    client = paramiko.SSHClient()
    # The instance's sshd key is the console's (access.ensure_host_key): pinned, as a customer is.
    instance.refresh_from_db(fields=["ssh_host_key"])
    import io

    host_key = paramiko.Ed25519Key.from_private_key(io.StringIO(instance.ssh_host_key))
    client.get_host_keys().add(f"[127.0.0.1]:{part.ssh_port}", host_key.get_name(), host_key)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        "127.0.0.1", port=part.ssh_port, username="root",
        key_filename=str(tmp_path / "alice_key"), look_for_keys=False, allow_agent=False,
        timeout=10,
    )  # fmt: skip
    try:
        _in, out, _err = client.exec_command("sinfo -h -N | wc -l", timeout=20)
        assert out.read().decode().strip() == "8"
    finally:
        client.close()
    slurm_jobs.refresh_queue(instance)
    assert SlurmJob.objects.get(instance=instance, slurm_id=terminal_id).name == "from-terminal"

    # Release: the daemons end with the instance; the keys leave the nodes.
    with django_capture_on_commit_callbacks(execute=True):
        assert services.release_instance(instance, by="alice")
    instance.refresh_from_db()
    assert instance.state == InstanceState.RELEASED, _events(instance)
    deadline = time.monotonic() + 10
    while processes_under(slurm_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_under(slurm_dir) == []
    assert not slurm_dir.exists()
    assert not SlurmCluster.objects.get(pk=cluster.pk).active


def test_job_mode_on_real_slurm_releases_the_slice_when_its_job_ends(
    fleet: SshFleet, funded, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    job = {"script": "#!/bin/bash\nsrun -N 2 hostname\nexit 0\n", "name": "task", "nodes": 2}
    instance = run_order(
        funded, django_capture_on_commit_callbacks, gpu_model="A800", cards=64, job=job
    )
    assert instance.state == InstanceState.RUNNING, _events(instance)
    order_job = SlurmJob.objects.get(instance=instance, from_order=True)
    deadline = time.monotonic() + 40
    while True:
        with django_capture_on_commit_callbacks(execute=True):
            outcome = slurm_jobs.follow_jobs(instance.pk)
        instance.refresh_from_db()
        if instance.state != InstanceState.RUNNING:
            break
        assert time.monotonic() < deadline, (outcome, _events(instance))
        time.sleep(0.3)
    order_job.refresh_from_db()
    assert order_job.slurm_state == "COMPLETED" and order_job.output.count("\n") == 2
    assert instance.state == InstanceState.RELEASED, _events(instance)
    codes = list(InstanceEvent.objects.filter(instance=instance).values_list("code", flat=True))
    assert codes.index("job_ended") < codes.index("job_release") < codes.index("released")


def test_a_restarted_controller_keeps_the_queue_from_pfs(
    fleet: SshFleet, funded, django_capture_on_commit_callbacks, run_dir: Path
) -> None:  # noqa: ANN001
    """rank 0's slurmctld dies (a crash, a re-driven start): the step 启动 Slurm runs again,
    keeps what still runs and starts the controller, which recovers its state from /pfs."""
    from slices.drivers import get_driver
    from slices.services import slurm
    from slices.services.provisioning import build_spec

    instance = run_order(funded, django_capture_on_commit_callbacks, gpu_model="A800", cards=64)
    assert instance.state == InstanceState.RUNNING, _events(instance)
    first = slurm_jobs.submit_job(instance, funded, {"script": "#!/bin/sh\necho one\n"})
    first = _follow_until(instance, first, {JobGroup.DONE})
    slurm_dir = run_dir / instance.slug
    slurmd_pids = sorted(int(p.read_text()) for p in slurm_dir.glob("slurmd-*.pid"))
    # (The pid files hold the instance's own pids: its PID namespace's.)
    controller = [
        pid
        for pid in processes_under(slurm_dir)
        if Path(f"/proc/{pid}/comm").read_text().strip() == "slurmctld"
    ]
    assert len(controller) == 1 and stop_pids(controller) == []

    lines: list[str] = []
    failure = slurm.start_slurm(instance, get_driver("ssh"), build_spec(instance), lines.append)
    assert failure is None, (failure, lines)
    # The slurmds went on (their config did not change); the controller is a new one.
    assert sorted(int(p.read_text()) for p in slurm_dir.glob("slurmd-*.pid")) == slurmd_pids
    second = slurm_jobs.submit_job(instance, funded, {"script": "#!/bin/sh\necho two\n"})
    assert second.slurm_id == first.slurm_id + 1  # its state came back from /pfs
    second = _follow_until(instance, second, {JobGroup.DONE})
    assert second.slurm_state == "COMPLETED" and second.output.strip() == "two"
    assert InstanceEvent.objects.filter(instance=instance, code="slurm_started").count() == 2
    with django_capture_on_commit_callbacks(execute=True):
        assert services.release_instance(instance, by="alice")


@pytest.fixture
def spare_fleet(settings, ssh_hosts: SshHostPool, tmp_path: Path, run_dir: Path) -> SshFleet:  # noqa: ANN001, F811
    """The A800 cluster with two spare nodes per SU (10 nodes on 10 test hosts)."""
    from tests.slices.factories import SMALL_FLEET

    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SSH_CONNECT_TIMEOUT = 5.0
    settings.SLICES_SSH_COMMAND_TIMEOUT = 60.0
    settings.SLICES_SLURM_RUN_DIR = str(run_dir)
    settings.SLICES_NODE_FAIL_GRACE_SECONDS = 60
    settings.SLICES_PFS_CONSOLE_ROOT = str(tmp_path / "pfs")
    load_small_fleet(SMALL_FLEET.replace("scalable_units: [8]", "scalable_units: [10, 10]"))
    nodes = list(Node.objects.filter(cluster__code="yc-a800").order_by("su__index", "index"))[:10]
    return configure_ssh_fleet(
        settings, ssh_hosts.get(10), nodes, tmp_path, client_key=ssh_hosts.client_key
    )


def test_a_replaced_node_joins_the_slices_real_slurm(
    spare_fleet: SshFleet, funded, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    from datetime import timedelta

    from django.utils import timezone

    from slices.services import migration

    instance = run_order(funded, django_capture_on_commit_callbacks, gpu_model="A800", cards=64)
    assert instance.state == InstanceState.RUNNING, _events(instance)
    job = slurm_jobs.submit_job(
        instance, funded,
        {"script": "#!/bin/bash\necho start $SLURM_RESTART_COUNT\nsleep 600\n", "name": "train",
         "nodes": 8},
    )  # fmt: skip
    job = _follow_until(instance, job, {JobGroup.RUNNING})
    victim = instance.nodes.get(rank=3).node
    t0 = timezone.now()
    migration.report_node_signal(victim, "xid", "Xid 79", at=t0)
    with django_capture_on_commit_callbacks(execute=True):
        assert migration.check_node_health(t0 + timedelta(seconds=61)) == [victim.hostname]
    instance.refresh_from_db()
    assert instance.state == InstanceState.RUNNING, _events(instance)
    hostnames = set(instance.nodes.values_list("hostname", flat=True))
    assert victim.hostname not in hostnames
    replacement = instance.nodes.get(rank=3).hostname
    # Slurm requeued the job that ran on the failed node (it starts again after Slurm's requeue
    # delay, about two minutes: not waited for here).
    slurm_jobs.refresh_queue(instance)
    job.refresh_from_db()
    assert job.slurm_state == "PENDING", (job.slurm_state, job.reason)  # NodeDown, BeginTime
    assert job.output.startswith("start")
    assert InstanceEvent.objects.filter(instance=instance, code="slurm_started").count() == 2
    slurm_jobs.cancel_job(job, funded)
    # The replacement is one of the slice's Slurm nodes: a job on all 8 runs on it too.
    check = slurm_jobs.submit_job(
        instance, funded, {"script": "#!/bin/bash\nsrun -N 8 hostname -s\n", "nodes": 8}
    )
    check = _follow_until(instance, check, {JobGroup.DONE}, timeout=60)
    assert check.slurm_state == "COMPLETED", check.output
    ran_on = _hostnames(check.node_list)
    assert replacement in ran_on and victim.hostname not in ran_on and len(ran_on) == 8, ran_on
    assert len(check.output.splitlines()) == 8
    with django_capture_on_commit_callbacks(execute=True):
        assert services.release_instance(instance, by="alice")


@pytest.fixture
def tenant_netns() -> Iterator[tuple[str, str]]:
    """Another tenant on the same test host, as a shared node runs one (docker's bridge): a
    network namespace of its own with a veth to the host; (its name, the host's address on
    the veth, which the tenant reaches the host by)."""
    import subprocess
    import uuid

    name = f"gpc-t{uuid.uuid4().hex[:8]}"
    host_if, tenant_if = f"{name}h", f"{name}t"
    octet = 16 + int(uuid.uuid4().int % 200)
    host_addr, tenant_addr = f"169.254.{octet}.1", f"169.254.{octet}.2"
    script = [
        f"ip netns add {name}",
        f"ip link add {host_if} type veth peer name {tenant_if}",
        f"ip link set {tenant_if} netns {name}",
        f"ip addr add {host_addr}/30 dev {host_if}",
        f"ip link set {host_if} up",
        f"ip -n {name} addr add {tenant_addr}/30 dev {tenant_if}",
        f"ip -n {name} link set {tenant_if} up",
        f"ip -n {name} link set lo up",
        f"ip -n {name} route add default via {host_addr}",
    ]
    try:
        for line in script:
            subprocess.run(line.split(), check=True, capture_output=True)  # noqa: S603
        yield name, host_addr
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)  # noqa: S607
        subprocess.run(["ip", "netns", "del", name], capture_output=True)  # noqa: S607


def _tenant_connects(netns: str, address: str, port: int) -> bool:
    """Whether a process of the tenant's namespace opens a TCP connection to address:port."""
    import subprocess

    probe = (
        "import socket,sys\n"
        "s=socket.socket(); s.settimeout(3)\n"
        "sys.exit(0 if s.connect_ex((sys.argv[1], int(sys.argv[2]))) == 0 else 1)\n"
    )
    done = subprocess.run(  # noqa: S603
        ["/usr/sbin/ip", "netns", "exec", netns, "/usr/bin/python3", "-c", probe, address,
         str(port)],
        capture_output=True, timeout=20,
    )  # fmt: skip
    return done.returncode == 0


def _listening(port: int) -> set[str]:
    """The local addresses (IPv4, dotted) with a TCP socket listening on ``port``."""
    import socket as sock
    import struct

    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        addr, _, hexport = fields[1].partition(":")
        if fields[3] == "0A" and int(hexport, 16) == port:
            found.add(sock.inet_ntoa(struct.pack("<I", int(addr, 16))))
    return found


def test_a_slices_slurm_daemons_listen_on_its_own_addresses_only(
    fleet: SshFleet, funded, django_capture_on_commit_callbacks, tenant_netns
) -> None:  # noqa: ANN001
    """The isolation rule: slurmctld and every slurmd listen on the slice's addresses (here
    the nodes' loopback), never on every interface, so another tenant on the same host (in its
    own network namespace, as a shared node runs tenants) cannot reach them, while the slice's
    own nodes (and their jobs) do."""
    import socket as sock

    netns, host_addr = tenant_netns
    instance = run_order(funded, django_capture_on_commit_callbacks, gpu_model="A800", cards=64)
    assert instance.state == InstanceState.RUNNING, _events(instance)
    cluster = SlurmCluster.objects.get(instance=instance)
    ctld = cluster.base_port
    slurmd_ports = [ctld + 2 + offset for offset in dict(cluster.node_ports).values()] or [
        ctld + 2 + i for i in range(HOSTS)
    ]
    # Bound to the slice's address only (NodeAddr / SlurmctldHost: 127.0.0.1 on these hosts).
    assert _listening(ctld) == {"127.0.0.1"}
    for port in slurmd_ports:
        assert _listening(port) == {"127.0.0.1"}, port

    # The control: the tenant does reach the host by its veth address, e.g. a service of the
    # host that listens on every interface (what slurmctld did before the rule).
    with sock.socket() as anywhere:
        anywhere.bind(("0.0.0.0", 0))  # noqa: S104
        anywhere.listen(1)
        assert _tenant_connects(netns, host_addr, anywhere.getsockname()[1])
    # The slice's slurmctld and slurmds: refused to the other tenant.
    assert not _tenant_connects(netns, host_addr, ctld)
    for port in slurmd_ports:
        assert not _tenant_connects(netns, host_addr, port)
    # ...and served to the slice's own nodes: a 2-node job runs.
    job = slurm_jobs.submit_job(
        instance, funded, {"script": "#!/bin/bash\nsrun -N 2 hostname\n", "nodes": 2}
    )
    job = _follow_until(instance, job, {JobGroup.DONE})
    assert job.slurm_state == "COMPLETED" and len(job.output.splitlines()) == 2
    with django_capture_on_commit_callbacks(execute=True):
        assert services.release_instance(instance, by="alice")
