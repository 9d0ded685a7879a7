"""Ordering and the instance lifecycle with the simulated driver (SIM_TIME_SCALE=0)."""

from __future__ import annotations

import pytest
from django.utils import translation

from billing import services as billing
from billing.models import UsageSession
from slices import services
from slices.choices import InstanceState
from slices.messages import event_text
from slices.models import Instance, InstanceEvent, Node
from tests.slices.factories import run_order

pytestmark = pytest.mark.django_db


def test_order_runs_to_running_and_bills(sim_fleet, funded, django_capture_on_commit_callbacks):
    instance = run_order(funded, django_capture_on_commit_callbacks, name="my box")
    assert instance.state == InstanceState.RUNNING, list(
        instance.events.values_list("code", "text")
    )
    codes = list(instance.events.filter(kind="state").values_list("code", flat=True))
    assert codes[:4] == ["ordered", "allocating", "allocated", "provisioning"]
    assert "running" in codes and "billing_started" in codes
    assert instance.nodes.get().step == "ready"
    assert (
        UsageSession.objects.filter(resource_id=str(instance.public_id), state="open").count() == 1
    )
    assert instance.ssh_host
    # The event stores the fleet code and says the model as people write it, in either language.
    ordered = instance.events.get(code="ordered")
    assert ordered.params["gpu_model"] == "RTX4090"
    with translation.override("en"):
        assert event_text("ordered", ordered.params) == "Ordered 8 × RTX 4090 by alice."
    with translation.override("zh-hans"):
        assert "8 × RTX 4090" in event_text("ordered", ordered.params)


def test_release_frees_gpus_and_closes_billing(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    instance = run_order(funded, django_capture_on_commit_callbacks)
    node = Node.objects.get(pk=instance.nodes.get().node_id)
    assert node.free_mask == 0
    with django_capture_on_commit_callbacks(execute=True):
        assert services.release_instance(instance, by="alice")
    instance.refresh_from_db()
    assert instance.state == InstanceState.RELEASED
    node.refresh_from_db()
    assert node.free_mask == node.full_mask
    assert not UsageSession.objects.filter(
        resource_id=str(instance.public_id), state="open"
    ).exists()
    # idempotent
    assert not services.release_instance(instance, by="alice")


def test_failed_step_fails_cleanly(sim_fleet, funded, django_capture_on_commit_callbacks):
    instance = run_order(
        funded, django_capture_on_commit_callbacks, platform_env={"SIM_FAIL": "start"}
    )
    assert instance.state == InstanceState.FAILED
    assert instance.failure_code == "sim_failure"
    node = Node.objects.get(pk=instance.nodes.get().node_id)
    assert node.free_mask == node.full_mask
    assert not UsageSession.objects.filter(resource_id=str(instance.public_id)).exists()


def test_transient_failure_is_retried(sim_fleet, funded, django_capture_on_commit_callbacks):
    instance = run_order(
        funded, django_capture_on_commit_callbacks, platform_env={"SIM_FAIL": "mount~"}
    )
    assert instance.state == InstanceState.RUNNING
    assert InstanceEvent.objects.filter(instance=instance, code="step_retry").count() == 1


def test_slice_runs_with_partition_and_allreduce(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    instance = run_order(funded, django_capture_on_commit_callbacks, gpu_model="A800", cards=64)
    assert instance.state == InstanceState.RUNNING
    assert instance.nodes.count() == 8
    assert instance.partition_key
    assert instance.allreduce.get("busbw_gbps")


def test_reconciler_auto_releases_and_frees_leaks(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    from datetime import timedelta

    from django.utils import timezone

    from slices.services.reconcile import reconcile

    instance = run_order(funded, django_capture_on_commit_callbacks)
    stray = services.allocate(funded, 1, "RTX4090")  # GPUs held by no instance
    later = timezone.now() + timedelta(hours=2)
    Instance.objects.filter(pk=instance.pk).update(auto_release_at=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        report = reconcile(now=later)
    assert report.auto_released == [str(instance.public_id)]
    assert report.leaked == [str(stray.public_id)]
    instance.refresh_from_db()
    assert instance.state == InstanceState.RELEASED
    # Running but no open usage session (billing stopped it): released by the reconciler.
    other = run_order(funded, django_capture_on_commit_callbacks)
    billing.close_usage_session("instance", str(other.public_id))
    with django_capture_on_commit_callbacks(execute=True):
        report = reconcile()
    assert report.unbilled == [str(other.public_id)]


def test_billing_stop_releases_the_instance(sim_fleet, funded, django_capture_on_commit_callbacks):
    instance = run_order(funded, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        services.stop_for_billing("instance", str(instance.public_id), "balance exhausted")
    instance.refresh_from_db()
    assert instance.state == InstanceState.RELEASED
    assert instance.events.filter(code="billing_stopped").exists()
