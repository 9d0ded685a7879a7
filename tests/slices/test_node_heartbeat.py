"""Node health judged on the node's own word (issue 29): a heartbeat comes from the node (the
driver's probe, its agent, a start on it), never from an instance's GPU samples.

Seen in the embedded demo before: a node idle for longer than the grace was failed the moment it
ran a new instance, and a 无卡模式 run (no GPU samples) was failed after the grace; a GPU-less
instance on a failed node then waited for a free GPU it does not need. All with the simulated
fleet and the reconciler's real passes, on a clock moved by the test.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from slices.choices import InstanceState, NodeState
from slices.drivers.sim import SimDriver
from slices.models import GpuRollup, Instance, Node, NodeFailure, NodeWatch
from slices.services import migration, power
from slices.services.reconcile import reconcile
from tests.slices.factories import run_order

pytestmark = pytest.mark.django_db


def _reconcile(capture, now) -> list[str]:  # noqa: ANN001
    with capture(execute=True):
        return reconcile(now).nodes_failed


def _gpu_minute(instance: Instance, hostname: str, minute) -> None:  # noqa: ANN001
    """One minute of GPU telemetry from ``instance`` on ``hostname`` (what the relay writes)."""
    stats = {
        f"{k}_{s}": 1.0
        for k in ("util", "mem_used", "temp", "power")
        for s in ("min", "mean", "max")
    }
    GpuRollup.objects.create(
        instance=instance, hostname=hostname, gpu=0, minute=minute, samples=60, mem_total=24.0,
        xid_events=0, **stats,
    )  # fmt: skip


def test_an_idle_node_given_a_new_instance_is_not_failed(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    t0 = timezone.now()
    # Every 4090 host was last heard of hours ago (the GPU samples of an earlier instance, say).
    for node in Node.objects.filter(gpu_model__code="RTX4090"):
        migration.record_heartbeat(node, at=t0 - timedelta(hours=3))
    inst = run_order(funded, capture, cards=8)
    assert inst.state == InstanceState.RUNNING
    node = inst.nodes.get().node
    assert migration.check_node_health(timezone.now()) == []
    watch = NodeWatch.objects.get(node=node)
    assert watch.heartbeat_source == "start" and watch.last_heartbeat_at >= t0  # renewed
    # Ten minutes of the reconciler (every 30 s): the node answers its probes, nothing fails.
    for k in range(1, 21):
        assert _reconcile(capture, t0 + timedelta(seconds=30 * k)) == []
    inst.refresh_from_db()
    node.refresh_from_db()
    assert inst.state == InstanceState.RUNNING and node.state != NodeState.FAILED
    assert NodeWatch.objects.get(node=node).heartbeat_source == "probe"
    assert not NodeFailure.objects.exists()


def test_a_gpuless_run_longer_than_the_grace_is_not_failed(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    inst = run_order(funded, capture, cards=4)
    node = inst.nodes.get().node
    t0 = timezone.now()
    minute = t0.replace(second=0, microsecond=0) - timedelta(minutes=1)
    _gpu_minute(inst, node.hostname, minute)  # it ran with its cards: GPU samples
    migration.ingest_telemetry(t0)
    with capture(execute=True):
        assert power.stop_instance(inst, by="alice")
    with capture(execute=True):
        power.start_instance(inst, by="alice", mode="gpuless")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING and inst.gpuless
    # Three hours without a GPU sample, the reconciler every 5 minutes.
    for k in range(1, 37):
        assert _reconcile(capture, t0 + timedelta(minutes=5 * k)) == []
    inst.refresh_from_db()
    node.refresh_from_db()
    assert inst.state == InstanceState.RUNNING and inst.nodes.get().node_id == node.pk
    assert node.state != NodeState.FAILED and not NodeFailure.objects.exists()


def test_a_node_that_stops_answering_is_failed_with_its_evidence(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    inst = run_order(funded, capture, cards=8)
    node = inst.nodes.get().node
    t0 = timezone.now()
    SimDriver.silence(node.hostname)
    assert _reconcile(capture, t0) == []  # one miss
    SimDriver.revive(node.hostname)  # it answers again: the miss is forgotten
    assert _reconcile(capture, t0 + timedelta(seconds=30)) == []
    assert NodeWatch.objects.get(node=node).misses == 0
    assert not NodeWatch.objects.get(node=node).bad_signal

    SimDriver.silence(node.hostname)  # now for good, after 5 minutes nobody asked
    t1 = t0 + timedelta(minutes=5)
    for k in range(6):  # silence is counted from the first miss, not from the last heartbeat
        assert _reconcile(capture, t1 + timedelta(seconds=30 * k)) == []
    assert _reconcile(capture, t1 + timedelta(seconds=180)) == [node.hostname]  # the grace
    node.refresh_from_db()
    assert node.state == NodeState.FAILED
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING and inst.nodes.get().node_id != node.pk  # migrated
    failure = NodeFailure.objects.get(node=node)
    assert failure.automatic and failure.signal == "ssh_lost"
    assert "simulated outage" in failure.detail
    ev = failure.evidence
    assert ev["rule"] == "silence" and ev["misses"] == 7 and ev["heartbeat_source"] == "probe"
    assert ev["last_heartbeat_at"] == (t0 + timedelta(seconds=30)).isoformat()
    assert ev["bad_since"] == t1.isoformat()
    assert ev["instances"] == [f"{inst.name} ({inst.short_id})"]


def test_a_gpuless_instance_on_a_failed_node_moves_while_no_gpu_is_free(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    inst = run_order(funded, capture, cards=4)
    with capture(execute=True):
        assert power.stop_instance(inst, by="alice")
    run_order(funded, capture, cards=8)
    run_order(funded, capture, cards=8)  # both 4090 hosts full now
    assert not Node.objects.filter(gpu_model__code="RTX4090", free_mask__gt=0).exists()
    with capture(execute=True):
        power.start_instance(inst, by="alice", mode="gpuless")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING and inst.gpuless
    old = inst.nodes.get().node
    t0 = timezone.now()
    migration.report_node_signal(old, "xid", "Xid 79: GPU has fallen off the bus", at=t0)
    with capture(execute=True):
        assert migration.check_node_health(t0 + timedelta(seconds=61)) == [old.hostname]
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "params"))
    part = inst.nodes.get()
    assert part.node_id != old.pk and part.gpu_mask == 0 and inst.gpuless
    assert "no_replacement" not in inst.events.values_list("code", flat=True)
    assert inst.ssh_host == part.node.address


def test_the_operator_pages_show_each_failure_with_its_signal_evidence_and_history(
    sim_fleet, funded, operator_client, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    inst = run_order(funded, capture, cards=8)
    node = inst.nodes.get().node
    SimDriver.silence(node.hostname)
    t0 = timezone.now()
    for k in range(8):
        _reconcile(capture, t0 + timedelta(seconds=30 * k))
    node.refresh_from_db()
    assert node.state == NodeState.FAILED
    url = reverse("slices:ops-node", args=[node.public_id])
    page = operator_client.get(url, HTTP_ACCEPT_LANGUAGE="en").content.decode()
    history = page[page.index('id="node-failures"') :]
    assert "ssh_lost" in history and "simulated outage, no answer" in history
    assert "the console" in history and "Failed probes in a row" in history
    assert "no answer to the console&#x27;s probes within the grace" in history
    assert "the console&#x27;s probe" in history  # where the last heartbeat came from
    assert inst.short_id in history  # the instance it moved
    zh = operator_client.get(url, HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "连续探测失败" in zh and "故障记录" in zh
    # The operator returns it; a later failure by hand joins the history.
    SimDriver.revive(node.hostname)
    operator_client.post(url, {"action": "return", "note": "cable reseated"})
    operator_client.post(url, {"action": "fail", "note": "fan noise"})
    page = operator_client.get(url, HTTP_ACCEPT_LANGUAGE="en").content.decode()
    history = page[page.index('id="node-failures"') :]
    assert "returned to service" in history and "fan noise" in history
    assert "an operator" in history
    assert [f.automatic for f in NodeFailure.objects.filter(node=node).order_by("id")] == [
        True,
        False,
    ]
    fleet = operator_client.get(reverse("slices:ops-fleet"), HTTP_ACCEPT_LANGUAGE="en")
    text = fleet.content.decode()
    assert text.count(node.hostname) >= 2 and "simulated outage" in text
