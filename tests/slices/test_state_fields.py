"""Decisions read fields, not the event log (issue 18): a term is paid once however often the
instance is provisioned again (``term_paid_until``), and a start on another host moves the system
disk once, even when its worker is re-driven (``disk_move_from``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from billing.models import Account, TermRental, UsageSession
from slices import services
from slices.choices import InstanceState
from slices.models import Instance, Node
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


# -- issue 30: the decisions that still read the event log -------------------------------------


def _migrate(inst, capture) -> None:  # noqa: ANN001
    """Fail the node under ``inst`` and let the health check move it (the grace long past)."""
    node = inst.nodes.get().node
    t0 = timezone.now()
    migration.report_node_signal(node, "xid", "Xid 79: GPU has fallen off the bus", at=t0)
    with capture(execute=True):
        assert migration.check_node_health(t0 + timedelta(days=1)) == [node.hostname]
    inst.refresh_from_db()


def test_the_migration_voucher_and_the_isolation_read_fields_not_the_event_log(
    sim_fleet, funded, settings, django_capture_on_commit_callbacks
):
    settings.SLICES_MIGRATION_VOUCHER = "20"
    vouchers = Account.objects.filter(wallet__team__personal_of=funded, kind="voucher")
    before = vouchers.count()
    inst = run_order(funded, django_capture_on_commit_callbacks, cards=1)
    assert inst.isolated_at is not None and inst.replacements == 0
    isolated_at = inst.isolated_at
    first_node = inst.nodes.get().node
    _migrate(inst, django_capture_on_commit_callbacks)
    assert inst.state == InstanceState.RUNNING and inst.replacements == 1
    assert inst.migration_checkpoint_noted  # this migration's checkpoint event is written
    assert vouchers.count() == before + 1
    assert inst.events.filter(code="isolated").count() == 1  # provisioned again, not isolated
    # The event rows are history for people: with them gone, the decisions stand. The second
    # migration grants its own voucher (a key counting events would repeat the first's and grant
    # nothing), and the instance is still not isolated again.
    inst.events.all().delete()
    first_node.refresh_from_db()
    assert services.change_node_state(first_node, "return", "repaired")  # a node to move to
    _migrate(inst, django_capture_on_commit_callbacks)
    assert inst.state == InstanceState.RUNNING and inst.replacements == 2
    assert vouchers.count() == before + 2
    assert inst.isolated_at == isolated_at
    assert not inst.events.filter(code="isolated").exists()
    assert (
        inst.events.filter(code="checkpoint_found").count()
        + inst.events.filter(code="no_checkpoint").count()
        == 1
    )  # the new migration noted its checkpoint once


def test_the_data_migration_fills_the_fields_from_the_event_log(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    from importlib import import_module

    from django.apps import apps as django_apps

    from slices.services.instances import record_event, record_logs

    from_events = import_module("slices.migrations.0013_state_fields_from_events").from_events
    inst = run_order(funded, django_capture_on_commit_callbacks, cards=1)
    now = timezone.now()
    for code in ("replacement_allocated", "no_replacement", "replacement_allocated"):
        record_event(inst, "state", code=code)
    record_event(inst, "state", code="app_not_answering", at=now - timedelta(hours=2))
    record_event(inst, "state", code="app_not_answering", at=now)
    record_event(inst, "state", code="starting", at=now - timedelta(hours=1))
    record_event(inst, "state", code="migrating", at=now)
    record_event(inst, "state", code="no_checkpoint")
    provisioning_at = inst.events.filter(code="provisioning").get().at
    record_logs(inst, [("n1", "run", "step 1"), ("n1", "run", "step 2"), ("n1", "setup", "x")])
    first_isolated = inst.events.filter(code="isolated").get().at
    record_event(inst, "step", code="isolated", at=now)  # a later one: the first counts
    Instance.objects.filter(pk=inst.pk).update(
        state=InstanceState.MIGRATING,
        replacements=0,
        isolated_at=None,
        app_gave_up_at=None,
        migration_checkpoint_noted=False,
        migration_wait_told=False,
        restarted_at=None,
        provisioning_noted_at=None,
        output_read=0,
    )
    from_events(django_apps, None)
    inst.refresh_from_db()
    assert inst.replacements == 2
    assert inst.isolated_at == first_isolated
    assert inst.app_gave_up_at == now
    assert inst.restarted_at == now  # the latest start or migration
    assert inst.provisioning_noted_at == provisioning_at
    assert inst.output_read == 2  # the workload's lines, not the provisioning's
    # Told since the latest migrating event: its checkpoint, not the wait (that was before it).
    assert inst.migration_checkpoint_noted and not inst.migration_wait_told


def test_a_start_keeps_when_it_began_for_the_eta_and_its_timeline_is_no_orders(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    from slices.services import eta

    inst = run_order(funded, django_capture_on_commit_callbacks, cards=4)
    assert inst.restarted_at is None and inst.provisioning_noted_at is not None
    assert eta._started_at(inst) == inst.created_at
    with django_capture_on_commit_callbacks(execute=True):
        assert power.stop_instance(inst, by="alice")
    with django_capture_on_commit_callbacks(execute=False):
        power.start_instance(inst, by="alice", mode="auto")
    inst.refresh_from_db()
    starting = inst.events.get(code="starting")
    assert abs((inst.restarted_at - starting.at).total_seconds()) < 1
    inst.events.all().delete()  # history for people: the field is the record
    assert eta._started_at(inst) == inst.restarted_at
    cache.delete(f"slices:eta-history:{inst.driver}:{inst.gpu_model_id}")  # read afresh
    assert eta.history(inst.driver, inst.gpu_model_id) == []  # a start is not an order's timeline
