"""Node health and hot migration with the simulated driver (SIM_TIME_SCALE=0).

A failure injected into a running 64-card slice (an Xid error on one node, not cleared within the
grace) ends with the slice running again on a replacement node in the same SU, the job resuming
from the latest whole checkpoint on the PFS, and the GPU charge excluding the gap.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from billing import services as billing
from billing.models import Account, UsageSession
from slices import services
from slices.choices import InstanceState, NodeState
from slices.drivers.sim import SimDriver
from slices.models import Instance, Node, NodeWatch
from slices.services import migration, storage
from slices.services.reconcile import reconcile
from tests.slices.factories import SMALL_FLEET, load_small_fleet

pytestmark = pytest.mark.django_db

# The A800 cluster with two spare nodes in each SU: a 64-card slice fills 8 of an SU's 10.
SPARE_FLEET = SMALL_FLEET.replace("scalable_units: [8]", "scalable_units: [10, 10]")


@pytest.fixture
def sim(sim_driver, settings, tmp_path):
    settings.SLICES_PFS_CONSOLE_ROOT = str(tmp_path / "pfs")
    settings.SLICES_NODE_FAIL_GRACE_SECONDS = 60
    settings.SLICES_MIGRATION_VOUCHER = "20"
    return tmp_path / "pfs"


@pytest.fixture
def funded(alice):
    billing.grant_voucher(alice, Decimal("50000"), reason="test", valid_days=30)
    return alice


def _order_slice(user, capture, **kw):
    req = services.OrderRequest(gpu_model="A800", cards=64, **kw)
    with capture(execute=True):
        instance, _created = services.order_instance(user, req)
    instance.refresh_from_db()
    assert instance.state == InstanceState.RUNNING, list(
        instance.events.values_list("code", "params")
    )
    return instance


def _write_checkpoint(root: Path, instance: Instance, step: int, *, whole: bool = True) -> None:
    d = root / storage.account_dir(instance.team) / "checkpoints" / storage.checkpoint_run(instance)
    d = d / f"step-{step}"
    d.mkdir(parents=True)
    (d / "model.pt").write_bytes(b"\0" * 1024)
    if not whole:
        (d / ".incomplete").write_text("")


def _fail(node: Node, capture) -> None:
    """An Xid error on ``node``, then the grace passes (the reconciler's health check)."""
    t0 = timezone.now()
    migration.report_node_signal(node, "xid", "Xid 79: GPU has fallen off the bus", at=t0)
    assert migration.check_node_health(t0 + timedelta(seconds=30)) == []  # still in the grace
    with capture(execute=True):
        assert migration.check_node_health(t0 + timedelta(seconds=61)) == [node.hostname]


def test_failed_node_of_a_64_card_slice_migrates_within_its_su_and_resumes(
    sim, funded, django_capture_on_commit_callbacks
):
    load_small_fleet(SPARE_FLEET)
    inst = _order_slice(funded, django_capture_on_commit_callbacks)
    parts = list(inst.nodes.select_related("node").order_by("rank"))
    assert len(parts) == 8 and len({p.node.su_id for p in parts}) == 1
    _write_checkpoint(sim, inst, 1200)
    _write_checkpoint(sim, inst, 800)
    _write_checkpoint(sim, inst, 1300, whole=False)  # being written when the node died
    victim = parts[0].node  # rank 0: the SSH details must change too
    old_ssh = inst.ssh_host
    _fail(victim, django_capture_on_commit_callbacks)

    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "params"))
    victim.refresh_from_db()
    assert victim.state == NodeState.FAILED
    # The owner is told, once (issue 33): the notice centre, and mail and SMS after the commit.
    from console.notices.models import Notice

    told = Notice.objects.get(recipient=funded, event="node_failed_migrating")
    assert told.params == {"name": inst.name, "node": victim.hostname}
    new_parts = list(inst.nodes.select_related("node").order_by("rank"))
    assert victim.pk not in {p.node_id for p in new_parts}
    replacement = new_parts[0].node
    assert replacement.su_id == victim.su_id  # same SU: the slice stays one hop apart
    assert inst.allocation.nodes.get(rank=0).node_id == replacement.pk
    assert replacement.free_mask == 0
    # identity kept, SSH details updated
    assert Instance.objects.filter(public_id=inst.public_id).count() == 1
    assert inst.ssh_host == replacement.address != old_ssh
    # resumed from the latest whole checkpoint, not from step 0 (and not the incomplete one)
    assert inst.checkpoint["step"] == 1200
    found = inst.events.get(code="checkpoint_found")
    assert found.params["step"] == 1200
    resume = f"/pfs/checkpoints/{storage.checkpoint_run(inst)}/step-1200"
    resumed_on = set(
        inst.events.filter(
            kind="log", text__contains=f"resumes from checkpoint {resume}"
        ).values_list("node", flat=True)
    )
    assert resumed_on == {p.hostname for p in new_parts}  # every rank restarts from it
    moved = inst.events.get(code="replacement_allocated").params["moves"]
    assert moved == [
        {
            "from": victim.hostname,
            "to": replacement.hostname,
            "same_su": True,
            "su": replacement.su.name,
            "rank": 0,
        }
    ]
    # billing: the first session closed (migrated) at the failure, the second opened at running
    first, second = UsageSession.objects.filter(
        resource_kind="instance", resource_id=str(inst.public_id)
    ).order_by("id")
    assert first.state == "closed" and first.close_reason == "migrated"
    assert second.state == "open" and second.cards == 64
    migrating_at = inst.events.get(code="migrating").at
    running_again = inst.events.filter(code="running").order_by("-id").first().at
    assert first.ended_at <= migrating_at + timedelta(seconds=1)
    assert second.started_at == inst.running_at and second.started_at >= running_again - timedelta(
        seconds=1
    )
    assert second.started_at >= first.ended_at  # nothing billed twice, the gap not billed
    # the compensation voucher
    assert Account.objects.filter(wallet__team__personal_of=funded, kind="voucher").count() == 2
    codes = list(inst.events.filter(kind="state").values_list("code", flat=True))
    i = codes.index("migrating")
    assert codes[i:].count("running") == 1 and "billing_paused" in codes[i:]


def test_no_replacement_waits_then_the_owner_releases(
    sim, funded, django_capture_on_commit_callbacks
):
    load_small_fleet()  # one A800 SU of 8 nodes: no spare
    inst = _order_slice(funded, django_capture_on_commit_callbacks)
    victim = inst.nodes.order_by("rank")[3].node
    _fail(victim, django_capture_on_commit_callbacks)
    inst.refresh_from_db()
    assert inst.state == InstanceState.MIGRATING
    assert inst.events.get(code="no_replacement").params == {"then": "wait"}
    # the reconciler retries without repeating the notice
    with django_capture_on_commit_callbacks(execute=True):
        reconcile()
    inst.refresh_from_db()
    assert inst.state == InstanceState.MIGRATING
    assert inst.events.filter(code="no_replacement").count() == 1
    assert not UsageSession.objects.filter(resource_id=str(inst.public_id), state="open").exists()
    with django_capture_on_commit_callbacks(execute=True):
        migration.set_no_replacement_choice(inst, "release")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RELEASED
    healthy = Node.objects.filter(cluster__code="yc-a800").exclude(pk=victim.pk)
    assert all(n.free_mask == n.full_mask for n in healthy)


def test_waiting_instance_migrates_once_an_operator_returns_a_node(
    sim, funded, django_capture_on_commit_callbacks
):
    load_small_fleet()
    inst = _order_slice(funded, django_capture_on_commit_callbacks)
    victim = inst.nodes.order_by("rank")[5].node
    _fail(victim, django_capture_on_commit_callbacks)
    assert Instance.objects.get(pk=inst.pk).state == InstanceState.MIGRATING
    # The operator repairs the node and returns it: it is clean and schedulable again.
    victim.refresh_from_db()
    assert services.change_node_state(victim, "return", "GPU reseated")
    with django_capture_on_commit_callbacks(execute=True):
        reconcile()
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING
    assert not NodeWatch.objects.get(node=victim).failed_at


def test_health_grace_recovery_and_lost_heartbeat(sim, funded, django_capture_on_commit_callbacks):
    load_small_fleet()
    with django_capture_on_commit_callbacks(execute=True):
        host, _ = services.order_instance(funded, services.OrderRequest(gpu_model="A800", cards=8))
    host.refresh_from_db()
    assert host.state == InstanceState.RUNNING
    b = host.nodes.get().node
    a = Node.objects.filter(cluster__code="yc-a800").exclude(pk=b.pk).order_by("pk").first()
    t0 = timezone.now()
    migration.report_node_signal(a, "nvml", "NVML_ERROR_GPU_IS_LOST", at=t0)
    migration.report_node_signal(a, "recovered", at=t0 + timedelta(seconds=20))
    migration.record_heartbeat(a, at=t0)  # silent, but nothing of a customer runs on it
    SimDriver.silence(b.hostname)  # b stops answering
    assert migration.probe_nodes(now=t0) == [b.hostname]
    assert migration.check_node_health(t0 + timedelta(seconds=181)) == []  # one miss: not yet
    assert migration.probe_nodes(now=t0 + timedelta(seconds=30)) == [b.hostname]
    assert migration.check_node_health(t0 + timedelta(seconds=170)) == []  # in the grace
    with django_capture_on_commit_callbacks(execute=True):
        assert migration.check_node_health(t0 + timedelta(seconds=181)) == [b.hostname]
    b.refresh_from_db()
    assert b.state == NodeState.FAILED and "simulated outage" in b.note
    a.refresh_from_db()
    assert a.state != NodeState.FAILED
    host.refresh_from_db()
    assert host.state == InstanceState.RUNNING and host.nodes.get().node_id != b.pk  # migrated
    # a failed node takes no new orders
    with pytest.raises(services.NoCapacity):
        services.allocate(funded, 64, "A800")


def _rollup(instance, hostname, minute, xids):
    from slices.models import GpuRollup

    stats = {
        f"{k}_{s}": 1.0
        for k in ("util", "mem_used", "temp", "power")
        for s in ("min", "mean", "max")
    }
    GpuRollup.objects.create(
        instance=instance,
        hostname=hostname,
        gpu=0,
        minute=minute,
        samples=60,
        mem_total=80.0,
        xid_events=xids,
        **stats,
    )


def test_xid_errors_in_the_telemetry_fail_the_node_after_the_grace(
    sim, funded, django_capture_on_commit_callbacks
):
    load_small_fleet(SPARE_FLEET)
    inst = _order_slice(funded, django_capture_on_commit_callbacks)
    part = inst.nodes.order_by("rank")[2]
    now = timezone.now().replace(second=0, microsecond=0)
    for p in inst.nodes.all():
        _rollup(inst, p.hostname, now - timedelta(minutes=3), 0)
    _rollup(inst, part.hostname, now - timedelta(minutes=2), 4)  # Xid errors start
    migration.ingest_telemetry(now - timedelta(minutes=1))
    assert migration.check_node_health(now - timedelta(minutes=1)) == []  # within the grace
    _rollup(inst, part.hostname, now - timedelta(minutes=1), 9)  # and persist
    migration.ingest_telemetry(now)
    with django_capture_on_commit_callbacks(execute=True):
        assert migration.check_node_health(now + timedelta(seconds=5)) == [part.hostname]
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING
    assert part.hostname not in set(inst.nodes.values_list("hostname", flat=True))
    assert "Xid" in Node.objects.get(hostname=part.hostname).note
