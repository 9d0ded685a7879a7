"""Ordering through the services with the ssh driver on real sshd test hosts.

The small fleet's A800 slice cluster (8 nodes) is pointed at 8 test hosts, each node with its own
workdir; orders run to running with the nodes provisioned in parallel, and release stops them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from billing.models import UsageSession
from console import services as console_services
from slices import services
from slices.choices import InstanceState
from slices.errors import OrderRefused
from slices.models import Instance, InstanceEvent, Node
from tests.slices.factories import load_small_fleet, run_order
from tests.support.sshd import (  # noqa: F401
    SshFleet,
    SshHostPool,
    configure_ssh_fleet,
    generate_key,
    process_alive,
    ssh_hosts,
    workload_pid,
)

pytestmark = pytest.mark.django_db

HOSTS = 8


@pytest.fixture
def fleet(settings, ssh_hosts: SshHostPool, tmp_path: Path) -> SshFleet:  # noqa: ANN001, F811
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SSH_CONNECT_TIMEOUT = 5.0
    settings.SLICES_SSH_COMMAND_TIMEOUT = 60.0
    load_small_fleet()
    nodes = list(Node.objects.filter(cluster__code="yc-a800").order_by("hostname"))
    assert len(nodes) == HOSTS
    return configure_ssh_fleet(
        settings, ssh_hosts.get(HOSTS), nodes, tmp_path, client_key=ssh_hosts.client_key
    )


def _order(user, capture, **kw) -> Instance:  # noqa: ANN001
    """A 64-card A800 slice: one whole job over all eight test hosts."""
    return run_order(user, capture, **{"gpu_model": "A800", "cards": 64, **kw})


def _instance_dir(fleet: SshFleet, hostname: str, instance: Instance) -> Path:
    return fleet.workdirs[hostname] / "instances" / instance.slug


def _env(path: Path) -> dict[str, str]:
    """The environment file as docker reads it (``--env-file``): NAME=value lines, literal."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def _events(instance: Instance) -> list[str]:
    return [
        f"{e.kind}:{e.code}:{e.node}:{e.text[:120]}"
        for e in InstanceEvent.objects.filter(instance=instance).order_by("pk")
    ]


def test_a_slice_runs_on_eight_ssh_hosts_in_parallel_and_release_stops_it(
    fleet: SshFleet, funded, django_capture_on_commit_callbacks, tmp_path: Path
) -> None:  # noqa: ANN001
    key = generate_key(tmp_path / "alice_key", "alice@laptop")
    console_services.add_ssh_key(funded, name="laptop", public_key=key)

    instance = _order(funded, django_capture_on_commit_callbacks, name="llm-pretrain")
    assert instance.state == InstanceState.RUNNING, _events(instance)
    assert instance.driver == "ssh"
    parts = list(instance.nodes.select_related("node").order_by("rank"))
    assert [p.rank for p in parts] == list(range(8))
    assert all(p.step == "ready" for p in parts)

    pids = []
    for part in parts:
        root = _instance_dir(fleet, part.node.hostname, instance)
        env = _env(root / "environment")
        assert env["NODE_RANK"] == str(part.rank)
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == "29500"
        assert env["WORLD_SIZE"] == "64"
        assert env["NNODES"] == "8"
        assert env["NCCL_IB_HCA"] and env["NCCL_SOCKET_IFNAME"]
        assert env["NCCL_IB_PKEY"] == str(instance.partition_key)
        assert env["INSTANCE_NAME"] == "llm-pretrain"
        assert (root / "hostfile").read_text().count("slots=8\n") == 8
        assert (root / "authorized_keys").read_text().split()[:2] == key.split()[:2]
        assert os.readlink(root / "pfs") == str(fleet.pfs_root / str(funded.public_id))
        pid = int((root / "pid").read_text())
        assert process_alive(pid)
        pids.append(pid)
    assert len(set(pids)) == 8

    # In parallel: other nodes finished connecting before the first node's health check passed
    # (one node after another would finish every step of a node before the next one connects).
    steps = list(
        InstanceEvent.objects.filter(instance=instance, code="step_done")
        .order_by("pk")
        .values_list("node", "step")
    )
    first_health = next(i for i, (_n, s) in enumerate(steps) if s == "health")
    assert len({n for n, s in steps[:first_health] if s == "connect"}) > 1
    # The all-reduce check says why it did not measure, and no GPU check pretends to have run.
    assert instance.allreduce == {"measured": False, "why": "no GPUs on the test hosts"}
    assert InstanceEvent.objects.filter(
        instance=instance, text__contains="no NVIDIA driver on this test host"
    ).exists()
    assert UsageSession.objects.filter(resource_id=str(instance.public_id), state="open").exists()

    with django_capture_on_commit_callbacks(execute=True):
        assert services.release_instance(instance, by="alice")
    instance.refresh_from_db()
    assert instance.state == InstanceState.RELEASED, _events(instance)
    assert not any(process_alive(pid) for pid in pids)
    for part in parts:
        assert not _instance_dir(fleet, part.node.hostname, instance).exists()
        node = Node.objects.get(pk=part.node_id)
        assert node.free_mask == node.full_mask
        assert node.health == "ok"
    assert not UsageSession.objects.filter(
        resource_id=str(instance.public_id), state="open"
    ).exists()


def test_a_changed_host_key_fails_the_order_cleanly_and_runs_nothing_there(
    fleet: SshFleet, funded, django_capture_on_commit_callbacks, tmp_path: Path
) -> None:  # noqa: ANN001
    impostor = Node.objects.filter(cluster__code="yc-a800").order_by("hostname")[3]
    other = generate_key(tmp_path / "impostor", "impostor")
    Node.objects.filter(pk=impostor.pk).update(host_key_fingerprint=other)

    instance = _order(funded, django_capture_on_commit_callbacks)
    assert instance.state == InstanceState.FAILED, _events(instance)
    assert instance.failure_code == "host_key_mismatch"
    assert not _instance_dir(fleet, impostor.hostname, instance).exists()
    # Whatever the other nodes started meanwhile was torn down; every GPU is free, nothing billed.
    for hostname in fleet.workdirs:
        root = _instance_dir(fleet, hostname, instance)
        assert not root.exists(), hostname
    for node in Node.objects.filter(cluster__code="yc-a800"):
        assert node.free_mask == node.full_mask
    assert not UsageSession.objects.filter(resource_id=str(instance.public_id)).exists()


def test_hostile_name_and_environment_reach_the_node_literally(
    fleet: SshFleet, funded, django_capture_on_commit_callbacks, tmp_path: Path
) -> None:  # noqa: ANN001
    marker = tmp_path / "pwned"
    payload = f"; $(touch {marker}) `touch {marker}` | touch {marker} & ' \" \\"
    note = f"first line{payload} touch {marker}"
    with pytest.raises(OrderRefused) as refused:  # no runtime's environment carries a line break
        _order(
            funded, django_capture_on_commit_callbacks, cards=8, env={"NOTE": f"a\ntouch {marker}"}
        )
    assert refused.value.params == {"name": "NOTE"}
    instance = _order(
        funded,
        django_capture_on_commit_callbacks,
        cards=8,
        name=f"box{payload}"[:63],
        env={"NOTE": note, "EMPTY": ""},
    )
    assert instance.state == InstanceState.RUNNING, _events(instance)
    part = instance.nodes.select_related("node").get()
    root = _instance_dir(fleet, part.node.hostname, instance)
    env = _env(root / "environment")
    assert env["NOTE"] == note
    assert env["INSTANCE_NAME"] == f"box{payload}"[:63]
    assert env["EMPTY"] == ""
    assert env["WORLD_SIZE"] == "8" and env["NODE_RANK"] == "0"
    pid = int((root / "pid").read_text())
    environ = Path(f"/proc/{workload_pid(pid)}/environ").read_bytes().split(b"\0")
    assert f"NOTE={note}".encode() in environ
    assert not marker.exists()
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(instance, by="alice")
    assert not process_alive(pid)
    assert not marker.exists()
