"""关机 / 开机 on a real sshd test host: stop ends the job and keeps the instance's directory (its
system disk); start on the same host finds the files and runs the job again."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from billing.models import UsageSession
from console.models import User
from slices import services
from slices.choices import InstanceState
from slices.models import Instance, Node
from slices.services import power
from tests.slices.factories import load_small_fleet, run_order
from tests.support.sshd import SshHostPool, configure_ssh_fleet, process_alive, ssh_hosts  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture
def small_fleet(settings) -> None:  # noqa: ANN001
    """The small fleet, its steps retried at once and bounded by short SSH timeouts."""
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SSH_CONNECT_TIMEOUT = 5.0
    settings.SLICES_SSH_COMMAND_TIMEOUT = 30.0
    load_small_fleet()


def order_box(user: User, capture: Callable[..., Any], cards: int) -> Instance:
    """An RTX 4090 box of ``cards`` cards, running (the step log shown if it is not)."""
    inst = run_order(user, capture, cards=cards, name="box")
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "text"))
    return inst


def test_stop_keeps_the_system_disk_and_start_runs_again(
    settings,
    small_fleet,
    ssh_hosts: SshHostPool,  # noqa: F811
    funded,
    tmp_path: Path,
    django_capture_on_commit_callbacks,
) -> None:
    node = Node.objects.get(hostname="xm-4090-r01-n01")
    for other in Node.objects.filter(cluster__code="xm-4090").exclude(pk=node.pk):
        services.change_node_state(other, "maintenance", "not a test host")
    fleet = configure_ssh_fleet(
        settings, ssh_hosts.get(1), [node], tmp_path, client_key=ssh_hosts.client_key
    )
    inst = order_box(funded, django_capture_on_commit_callbacks, cards=4)
    root = fleet.workdirs[node.hostname] / "instances" / inst.slug
    (root / "notes.txt").write_text("my work")  # something on the system disk
    pid = int((root / "pid").read_text())
    assert process_alive(pid)

    with django_capture_on_commit_callbacks(execute=True):
        assert power.stop_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.STOPPED
    assert not process_alive(pid) and (root / "notes.txt").read_text() == "my work"
    assert os.path.islink(root / "pfs")

    with django_capture_on_commit_callbacks(execute=True):
        result = power.start_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING and result.node == node.hostname
    assert (root / "notes.txt").read_text() == "my work"  # nothing on the disk was lost
    new_pid = int((root / "pid").read_text())
    assert new_pid != pid and process_alive(new_pid)
    sessions = UsageSession.objects.filter(
        resource_kind="instance", resource_id=str(inst.public_id)
    )
    assert [s.state for s in sessions.order_by("id")] == ["closed", "open"]
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(inst, by="alice")


def test_start_on_another_host_moves_the_system_disk(
    settings,
    small_fleet,
    ssh_hosts: SshHostPool,  # noqa: F811
    funded,
    tmp_path: Path,
    django_capture_on_commit_callbacks,
) -> None:
    a, b = Node.objects.filter(cluster__code="xm-4090").order_by("hostname")
    fleet = configure_ssh_fleet(
        settings, ssh_hosts.get(2), [a, b], tmp_path, client_key=ssh_hosts.client_key
    )
    inst = order_box(funded, django_capture_on_commit_callbacks, cards=8)
    first = inst.nodes.get().node
    second = b if first.pk == a.pk else a
    old_root = fleet.workdirs[first.hostname] / "instances" / inst.slug
    (old_root / "data").mkdir()
    (old_root / "data" / "notes.txt").write_text("my work")
    with django_capture_on_commit_callbacks(execute=True):
        power.stop_instance(inst, by="alice")
    services.change_node_state(first, "drain", "disk swap")  # its cards are not offered now
    with django_capture_on_commit_callbacks(execute=True):
        result = power.start_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "text"))
    assert result.moved_from == first.hostname and result.node == second.hostname
    new_root = fleet.workdirs[second.hostname] / "instances" / inst.slug
    assert (new_root / "data" / "notes.txt").read_text() == "my work"  # the disk moved
    assert os.readlink(new_root / "pfs") == str(fleet.pfs_root / str(funded.public_id))
    assert process_alive(int((new_root / "pid").read_text()))
    # The endpoint followed it: the instance's own sshd on its new node (issue 19).
    second.refresh_from_db()
    part = inst.nodes.get()
    assert part.node_id == second.pk and part.ssh_port is not None
    assert (inst.ssh_host, inst.ssh_port) == (second.address, part.ssh_port)
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(inst, by="alice")
