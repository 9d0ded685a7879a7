"""关机 / 开机 with the simulated driver: the GPU charge stops at stop and the storage charge runs;
start on the same host, on another host (the disk moves), and without GPUs; long-stopped release."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing import services as billing
from billing.models import TermRental, UsageSession
from slices import services
from slices.choices import InstanceState
from slices.errors import InstanceConflict
from slices.models import Instance, Node
from slices.services import disks, power
from slices.services.allocation import NoCapacity
from slices.services.instances import instance_cost, instance_costs
from slices.services.reconcile import reconcile
from tests.slices.factories import run_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim_fleet(sim_fleet, settings):
    settings.SLICES_SYSTEM_DISK_GB = 50
    return sim_fleet


def _order(user, capture, **kw):
    return run_order(user, capture, **{"cards": 4, **kw})


def _gpu_sessions(instance):
    return UsageSession.objects.filter(
        resource_kind="instance", resource_id=str(instance.public_id)
    ).order_by("id")


def _storage_open(user):
    return UsageSession.objects.filter(
        resource_kind="storage", resource_id=str(user.public_id), state="open"
    ).first()


def _stop(instance, capture):
    with capture(execute=True):
        assert power.stop_instance(instance, by="alice")
    instance.refresh_from_db()


def _start(instance, capture, mode="auto"):
    with capture(execute=True):
        result = power.start_instance(instance, by="alice", mode=mode)
    instance.refresh_from_db()
    return result


def test_stop_closes_gpu_charge_and_bills_the_system_disk(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    book = billing.current_price_book()
    # Fill the free storage quota with a disk, so the system disk is billable.
    disks.create_disk(funded, name="d", size_gb=book.storage_free_gb, region="xiamen")
    inst = _order(funded, django_capture_on_commit_callbacks)
    node = Node.objects.get(pk=inst.nodes.get().node_id)
    assert node.free_gpus == 4
    expected_per_day = (book.storage_per_gb_day * 50).quantize(Decimal("0.01"))
    assert power.stopped_cost_per_day(inst) == expected_per_day
    _stop(inst, django_capture_on_commit_callbacks)
    assert inst.state == InstanceState.STOPPED
    assert inst.allocation is None and inst.stopped_at is not None
    node.refresh_from_db()
    assert node.free_gpus == 8  # the GPUs went back
    [gpu] = _gpu_sessions(inst)
    assert gpu.state == "closed"
    storage = _storage_open(funded)
    assert storage is not None and storage.cards == 50  # the system disk, beyond the free GB
    stopping = inst.events.get(code="stopping")
    assert stopping.params["per_day"] == str(expected_per_day)
    logs = " ".join(inst.events.filter(kind="log").values_list("text", flat=True))
    assert "kept its system disk" in logs


def test_start_on_the_same_host_reopens_gpu_charge(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    inst = _order(funded, django_capture_on_commit_callbacks)
    host = inst.nodes.get().hostname
    _stop(inst, django_capture_on_commit_callbacks)
    result = _start(inst, django_capture_on_commit_callbacks)
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", flat=True))
    assert result.node == host and not result.moved_from
    assert [s.state for s in _gpu_sessions(inst)] == ["closed", "open"]
    assert _storage_open(funded) is None  # the system disk is in use again, not storage
    assert Node.objects.get(hostname=host).free_gpus == 4


def test_start_on_another_host_moves_the_disk(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    inst = _order(funded, django_capture_on_commit_callbacks)
    host = inst.nodes.get().hostname
    _stop(inst, django_capture_on_commit_callbacks)
    # Meanwhile an operator drains that host: it takes no new cards.
    assert services.change_node_state(Node.objects.get(hostname=host), "drain", "disk swap")
    result = _start(inst, django_capture_on_commit_callbacks)
    assert inst.state == InstanceState.RUNNING
    assert result.moved_from == host and result.node != host
    moved = inst.events.get(code="disk_moved")
    assert moved.params == {"from": host, "to": result.node, "gb": 50}
    logs = " ".join(inst.events.filter(kind="log").values_list("text", flat=True))
    assert f"from {host} to {result.node}" in logs
    assert inst.ssh_host == Node.objects.get(hostname=result.node).address


def test_same_host_only_refuses_when_busy_and_offers_gpuless(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    inst = _order(funded, django_capture_on_commit_callbacks)
    host = inst.nodes.get().hostname
    _stop(inst, django_capture_on_commit_callbacks)
    _order(funded, django_capture_on_commit_callbacks, cards=8)
    _order(funded, django_capture_on_commit_callbacks, cards=8)  # both 4090 hosts full now
    with pytest.raises(NoCapacity):
        power.start_instance(inst, by="alice", mode="same")
    with pytest.raises(NoCapacity):
        power.start_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.STOPPED  # nothing changed
    result = _start(inst, django_capture_on_commit_callbacks, mode="gpuless")
    assert inst.state == InstanceState.RUNNING and inst.gpuless
    assert result.node == host and inst.nodes.get().gpu_mask == 0
    assert [s.state for s in _gpu_sessions(inst)] == ["closed"]  # no GPU charge in 无卡模式
    assert "gpuless_running" in inst.events.values_list("code", flat=True)
    # The reconciler does not mistake the missing GPU session for a billing stop.
    reconcile()
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING


def test_only_running_hosts_stop(sim_fleet, funded, django_capture_on_commit_callbacks):
    inst = _order(funded, django_capture_on_commit_callbacks)
    _stop(inst, django_capture_on_commit_callbacks)
    with pytest.raises(InstanceConflict):
        power.stop_instance(inst, by="alice")
    slice_ = _order(funded, django_capture_on_commit_callbacks, gpu_model="A800", cards=64)
    with pytest.raises(InstanceConflict):
        power.stop_instance(slice_, by="alice")


def test_long_stopped_instance_is_warned_then_released(
    sim_fleet, funded, settings, django_capture_on_commit_callbacks
):
    settings.SLICES_STOPPED_RELEASE_DAYS = 7
    settings.SLICES_STOPPED_WARN_DAYS = [3, 1]
    inst = _order(funded, django_capture_on_commit_callbacks)
    # The bill knows where it ran (issue 33: 地域 in the bills).
    from billing.models import UsageSession

    session = UsageSession.objects.get(resource_id=str(inst.public_id))
    assert inst.region and session.region == inst.region.code
    _stop(inst, django_capture_on_commit_callbacks)
    start = inst.stopped_at
    reconcile(start + timedelta(days=2))
    assert not inst.events.filter(code="stopped_release_warning").exists()
    reconcile(start + timedelta(days=4, hours=1))
    reconcile(start + timedelta(days=4, hours=2))  # once per configured day
    assert inst.events.filter(code="stopped_release_warning").count() == 1
    reconcile(start + timedelta(days=6, hours=1))
    assert inst.events.filter(code="stopped_release_warning").count() == 2
    # Each warning is also a notice to the owner, sent once (issue 33: D-3, D-1 here).
    from console.notices.models import Notice

    warned = Notice.objects.filter(recipient=funded, event="release_warning")
    assert warned.count() == 2
    assert {n.params["days"] for n in warned} == {"3", "1"}
    with django_capture_on_commit_callbacks(execute=True):
        reconcile(start + timedelta(days=7, minutes=1))
    inst.refresh_from_db()
    assert inst.state == InstanceState.RELEASED
    assert "stopped_too_long" in inst.events.values_list("code", flat=True)
    assert _storage_open(funded) is None


def test_release_a_stopped_instance_stops_the_storage_charge(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    book = billing.current_price_book()
    disks.create_disk(funded, name="d", size_gb=book.storage_free_gb, region="xiamen")
    inst = _order(funded, django_capture_on_commit_callbacks)
    _stop(inst, django_capture_on_commit_callbacks)
    assert _storage_open(funded) is not None
    with django_capture_on_commit_callbacks(execute=True):
        assert services.release_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RELEASED
    assert _storage_open(funded) is None
    assert Instance.objects.get(pk=inst.pk).resources_freed_at is not None
    assert timezone.now() >= inst.ended_at


def _ran_for(instance, seconds):
    """Make the instance's open GPU session (and its run) ``seconds`` old."""
    start = timezone.now() - timedelta(seconds=seconds)
    UsageSession.objects.filter(
        resource_kind="instance", resource_id=str(instance.public_id), state="open"
    ).update(started_at=start)
    Instance.objects.filter(pk=instance.pk).update(running_at=start)
    instance.refresh_from_db()


def test_cost_so_far_counts_every_run_as_billed_and_nothing_without_gpus(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    """The cost on the instance's pages and API is what billing charged for each of its runs (a
    stop and a start open a new usage session), not the current run's seconds at the quoted rate;
    a 无卡模式 run has no GPU charge, so it adds nothing."""
    inst = _order(funded, django_capture_on_commit_callbacks)
    _ran_for(inst, 3600)
    first_hour = instance_cost(inst)
    assert first_hour == (inst.quoted_per_hour).quantize(Decimal("0.01"))  # 4 cards, one hour
    _stop(inst, django_capture_on_commit_callbacks)
    [closed] = _gpu_sessions(inst)
    assert instance_cost(inst) == closed.charged == first_hour

    _start(inst, django_capture_on_commit_callbacks, mode="same")
    _ran_for(inst, 1800)
    half_hour = (inst.quoted_per_hour / 2).quantize(Decimal("0.01"))
    assert instance_cost(inst) == first_hour + half_hour  # both runs, not only this one

    _stop(inst, django_capture_on_commit_callbacks)
    both = instance_cost(inst)
    assert both == sum(s.charged for s in _gpu_sessions(inst))
    _start(inst, django_capture_on_commit_callbacks, mode="gpuless")
    _ran_for(inst, 3600)
    assert inst.gpuless
    assert instance_cost(inst) == both  # 无卡模式: no GPU charge
    costs = instance_costs([inst])  # the list pages' one query gives the same figure
    assert costs == {inst.pk: both}


def test_a_term_counts_what_was_paid_and_an_on_demand_read_skips_the_terms(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    """A locked-price term costs what was paid up front, read beside an on-demand instance in one
    call; an on-demand instance never holds a term (its billing mode never changes), so reading
    its cost alone asks billing for its usage sessions only."""
    term = run_order(
        funded, django_capture_on_commit_callbacks, cards=1, billing_mode="term", term_days=1
    )
    demand = _order(funded, django_capture_on_commit_callbacks)
    _ran_for(demand, 3600)
    paid = TermRental.objects.get(resource_id=str(term.public_id)).total
    assert paid > 0
    hour = demand.quoted_per_hour.quantize(Decimal("0.01"))
    assert instance_costs([term, demand]) == {term.pk: paid, demand.pk: hour}
    with CaptureQueriesContext(connection) as alone:
        assert instance_cost(demand) == hour
    assert len(alone.captured_queries) == 1
    with CaptureQueriesContext(connection) as termed:
        assert instance_cost(term) == paid
    assert len(termed.captured_queries) == 2
