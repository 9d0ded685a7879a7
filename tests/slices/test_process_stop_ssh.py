"""A bare process's whole workload ends at 关机 and at release, on a real sshd test host: what it
forked, and what went into a session of its own (as Jupyter's kernels do), not only the process
the pid file names. The launcher's ``setsid`` session and its descendants are signalled by pid,
never by a pattern on names."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slices import services
from slices.choices import InstanceState
from slices.models import Instance, Node
from slices.services import power
from tests.slices.factories import load_small_fleet, run_order
from tests.support.sshd import (  # noqa: F401
    SshFleet,
    SshHostPool,
    configure_ssh_fleet,
    process_alive,
    ssh_hosts,
)

pytestmark = pytest.mark.django_db

# One child in the shell's session, one in a session of its own, one in the foreground.
FORKING = "/bin/sleep 300 & /usr/bin/setsid /bin/sleep 301 & /bin/sleep 302"


@pytest.fixture
def fleet(settings, ssh_hosts: SshHostPool, tmp_path: Path) -> SshFleet:  # noqa: ANN001, F811
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SSH_CONNECT_TIMEOUT = 5.0
    settings.SLICES_SSH_COMMAND_TIMEOUT = 60.0
    load_small_fleet()
    node = Node.objects.get(hostname="xm-4090-r01-n01")
    for other in Node.objects.filter(cluster__code="xm-4090").exclude(pk=node.pk):
        services.change_node_state(other, "maintenance", "not a test host")
    return configure_ssh_fleet(
        settings, ssh_hosts.get(1), [node], tmp_path, client_key=ssh_hosts.client_key
    )


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        try:
            children = Path(f"/proc/{todo.pop()}/task").glob("*/children")
            kids = {int(c) for f in children for c in f.read_text().split()}
        except FileNotFoundError:
            continue
        todo.extend(kids - found)
        found |= kids
    return found


def _sleeps(pids: set[int]) -> int:
    count = 0
    for p in pids:
        with contextlib.suppress(FileNotFoundError):
            count += Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"/bin/sleep\0")
    return count


def _workload(root: Path) -> tuple[int, set[int]]:
    """The launcher's pid and its live descendants, once the shell has started its children."""
    pid = int((root / "pid").read_text())
    deadline = time.monotonic() + 10
    while True:
        tree = {p for p in _descendants(pid) if process_alive(p)}
        if _sleeps(tree) == 3:
            return pid, tree
        assert time.monotonic() < deadline, f"the workload did not start its children: {tree}"
        time.sleep(0.05)


def _order(user: Any, capture: Callable[..., Any]) -> Instance:
    inst = run_order(user, capture, cards=1, name="forks", entrypoint=FORKING)
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "text"))
    return inst


def test_release_ends_everything_the_workload_forked(
    fleet: SshFleet, funded, django_capture_on_commit_callbacks
) -> None:
    inst = _order(funded, django_capture_on_commit_callbacks)
    root = fleet.workdirs["xm-4090-r01-n01"] / "instances" / inst.slug
    pid, tree = _workload(root)
    assert any(Path(f"/proc/{p}/stat").read_text().split()[5] == str(p) for p in tree), (
        "one child leads a session of its own"
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert services.release_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RELEASED
    assert [p for p in {pid, *tree} if process_alive(p)] == []
    assert not root.exists()


def test_stop_ends_everything_the_workload_forked_and_start_runs_it_again(
    fleet: SshFleet, funded, django_capture_on_commit_callbacks
) -> None:
    inst = _order(funded, django_capture_on_commit_callbacks)
    root = fleet.workdirs["xm-4090-r01-n01"] / "instances" / inst.slug
    pid, tree = _workload(root)
    with django_capture_on_commit_callbacks(execute=True):
        assert power.stop_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.STOPPED
    assert [p for p in {pid, *tree} if process_alive(p)] == []
    assert root.exists() and not (root / "pid").exists()

    with django_capture_on_commit_callbacks(execute=True):
        power.start_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING
    new_pid, new_tree = _workload(root)
    assert new_pid != pid
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(inst, by="alice")
    assert [p for p in {new_pid, *new_tree} if process_alive(p)] == []
