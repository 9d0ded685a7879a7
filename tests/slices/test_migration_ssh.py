"""Hot migration on real sshd test hosts: a job writes checkpoints to the shared directory (the
PFS); its host's sshd stops mid-run; the console notices the lost SSH, fails the node after the
grace, and the job starts again on the other test host with RESUME_FROM at the latest checkpoint.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from slices import services
from slices.choices import InstanceState, NodeState
from slices.models import Instance, Node, NodeWatch
from slices.services import migration, storage
from tests.slices.factories import load_small_fleet
from tests.support.sshd import SshHostPool, configure_ssh_fleet, sshd_available

pytestmark = pytest.mark.django_db

# The job: resume from $RESUME_FROM when set, then write a checkpoint directory every 0.2 s (the
# documented convention: $CHECKPOINT_DIR/step-N, .incomplete while it is written).
JOB = r"""
ck="pfs${CHECKPOINT_DIR#/pfs}"; step=0
if [ -n "$RESUME_FROM" ]; then step="${RESUME_FROM##*step-}"; echo "resumed from step $step" > resumed.txt; fi
while [ "$step" -lt 100000 ]; do
  step=$((step + 1)); mkdir -p "$ck/step-$step"; touch "$ck/step-$step/.incomplete"
  echo "$step" > "$ck/step-$step/state"; rm "$ck/step-$step/.incomplete"; sleep 0.2
done
"""


@pytest.fixture
def hosts(tmp_path: Path):
    """Two test hosts of this test's own (one is stopped: they are not the session's pool)."""
    if not sshd_available():
        pytest.fail("the SSH tests need sshd and root")
    pool = SshHostPool(tmp_path / "sshd")
    try:
        yield pool.get(2), pool
    finally:
        pool.stop()


def _wait_for(predicate, seconds: float = 20.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_stopped_sshd_migrates_the_job_to_another_host_resuming_from_the_checkpoint(
    settings, hosts, funded, tmp_path: Path, django_capture_on_commit_callbacks
) -> None:
    (a_host, b_host), pool = hosts
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SSH_CONNECT_TIMEOUT = 3.0
    settings.SLICES_SSH_COMMAND_TIMEOUT = 30.0
    settings.SLICES_NODE_HEARTBEAT_GRACE_SECONDS = 30
    load_small_fleet()
    nodes = list(Node.objects.filter(cluster__code="yc-a800").order_by("hostname"))
    a, b = nodes[:2]
    for other in nodes[2:]:  # only the two test hosts take work
        services.change_node_state(other, "maintenance", "not a test host")
    fleet = configure_ssh_fleet(
        settings, [a_host, b_host], [a, b], tmp_path, client_key=pool.client_key
    )
    settings.SLICES_PFS_CONSOLE_ROOT = str(fleet.pfs_root)  # the console's view of the PFS

    with django_capture_on_commit_callbacks() as queued:
        inst, _ = services.order_instance(
            funded, services.OrderRequest(gpu_model="A800", cards=8, name="trainer")
        )
    Instance.objects.filter(pk=inst.pk).update(entrypoint=JOB)  # the image's launch command
    for callback in queued:
        callback()
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "text"))
    first = inst.nodes.get().node
    other_host = b_host if first.pk == a.pk else a_host
    dead_host = a_host if first.pk == a.pk else b_host

    # Alive: the probe reads its uptime over the pinned connection, a heartbeat from the node.
    assert migration.probe_nodes() == []
    watch = NodeWatch.objects.get(node=first)
    assert watch.heartbeat_source == "probe" and watch.misses == 0
    run_dir = fleet.pfs_root / storage.account_dir(funded) / "checkpoints" / inst.slug
    _wait_for(lambda: (run_dir / "step-5").is_dir())
    # The host dies: its sshd stops (and the job with it).
    pid = int((fleet.workdirs[first.hostname] / "instances" / inst.slug / "pid").read_text())
    dead_host.stop()
    os.killpg(pid, signal.SIGKILL)
    time.sleep(0.3)
    last = max(
        int(p.name.split("-")[1]) for p in run_dir.iterdir() if not (p / ".incomplete").exists()
    )

    now = timezone.now()
    assert migration.probe_nodes(now=now) == [first.hostname]  # lost SSH
    assert migration.check_node_health(now + timedelta(seconds=31)) == []  # one miss only
    assert migration.probe_nodes(now=now + timedelta(seconds=5)) == [first.hostname]
    assert migration.check_node_health(now + timedelta(seconds=5)) == []  # within the grace
    with django_capture_on_commit_callbacks(execute=True):
        assert migration.check_node_health(now + timedelta(seconds=31)) == [first.hostname]

    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "text"))
    first.refresh_from_db()
    assert first.state == NodeState.FAILED
    new = inst.nodes.get().node
    assert new.pk != first.pk and new.ssh_port == other_host.port
    # The SSH details follow the instance: its own sshd on the new node (issue 19).
    moved = inst.nodes.get()
    assert moved.ssh_port is not None
    assert (inst.ssh_host, inst.ssh_port) == (new.address, moved.ssh_port)
    assert inst.checkpoint["step"] == last
    new_dir = fleet.workdirs[new.hostname] / "instances" / inst.slug
    _wait_for(lambda: (new_dir / "resumed.txt").exists())
    assert (new_dir / "resumed.txt").read_text().strip() == f"resumed from step {last}"
    _wait_for(lambda: (run_dir / f"step-{last + 2}").is_dir())  # and it goes on from there
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(inst, by="alice")
