"""Decisions read fields, not the event log (issue 18): a term is paid once however often the
instance is provisioned again (``term_paid_until``), and a start on another host moves the system
disk once, even when its worker is re-driven (``disk_move_from``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import TermRental, UsageSession
from slices import services
from slices.choices import InstanceState
from slices.models import Node
from slices.services import migration, power
from tests.slices.factories import run_order

pytestmark = pytest.mark.django_db


def test_a_term_is_paid_once_and_a_migration_does_not_pay_it_again(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    inst = run_order(
        funded, django_capture_on_commit_callbacks, cards=1, billing_mode="term", term_days=1
    )
    assert inst.state == InstanceState.RUNNING
    assert inst.term_paid_until == inst.auto_release_at
    assert inst.term_paid_until - inst.running_at == timedelta(days=1)
    paid_until = inst.term_paid_until
    node = inst.nodes.get().node
    t0 = timezone.now()
    migration.report_node_signal(node, "xid", "Xid 79: GPU has fallen off the bus", at=t0)
    with django_capture_on_commit_callbacks(execute=True):
        assert migration.check_node_health(t0 + timedelta(days=1)) == [node.hostname]
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING
    assert inst.nodes.get().node_id != node.pk  # it really moved and was provisioned again
    assert inst.term_paid_until == paid_until
    assert TermRental.objects.filter(resource_id=str(inst.public_id)).count() == 1
    # A term is not metered per second: no usage session was opened by the second running.
    assert not UsageSession.objects.filter(resource_id=str(inst.public_id)).exists()


def test_a_start_on_another_host_moves_the_disk_once(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    inst = run_order(funded, django_capture_on_commit_callbacks, cards=4)
    host = inst.nodes.get().hostname
    with django_capture_on_commit_callbacks(execute=True):
        assert power.stop_instance(inst, by="alice")
    assert services.change_node_state(Node.objects.get(hostname=host), "drain", "disk swap")
    with django_capture_on_commit_callbacks(execute=False):  # the worker has not run yet
        result = power.start_instance(inst, by="alice", mode="auto")
    inst.refresh_from_db()
    assert inst.state == InstanceState.PROVISIONING
    assert result.moved_from == host and inst.disk_move_from == host
    assert power.drive_start(inst.pk) == "running"
    inst.refresh_from_db()
    assert inst.disk_move_from == ""
    assert inst.events.filter(code="disk_moved").count() == 1
    # Re-driven (a redelivered task) it has nothing left to move.
    assert power.drive_start(inst.pk) == "nothing to do"
    assert inst.events.filter(code="disk_moved").count() == 1


def test_a_start_on_the_same_host_has_no_disk_to_move(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    inst = run_order(funded, django_capture_on_commit_callbacks, cards=4)
    with django_capture_on_commit_callbacks(execute=True):
        assert power.stop_instance(inst, by="alice")
    with django_capture_on_commit_callbacks(execute=True):
        power.start_instance(inst, by="alice", mode="auto")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING and inst.disk_move_from == ""
    assert not inst.events.filter(code="disk_moved").exists()
