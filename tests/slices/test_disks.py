"""Persistent cloud disks: create, resize, delete-in-use, multi-attach, attach at order time,
survive release, and the per-account storage charge through billing's disk meter."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.http import Http404
from django.utils import translation

from billing import services as billing
from billing.models import UsageSession
from slices import services
from slices.choices import InstanceState
from slices.services import disks
from tests.slices.factories import make_instance, run_order

pytestmark = pytest.mark.django_db


def _storage_sessions(user):
    return UsageSession.objects.filter(resource_kind="storage", resource_id=str(user.public_id))


def test_free_quota_then_billed_per_gb_day(sim_fleet, funded):
    book = billing.current_price_book()
    free = book.storage_free_gb
    small = disks.create_disk(funded, name="data", size_gb=free, region="xiamen")
    assert not _storage_sessions(funded).exists()  # within the free quota: nothing billed
    disks.create_disk(funded, name="more", size_gb=30, region="xiamen")
    session = _storage_sessions(funded).get(state="open")
    assert session.meter == "disk"
    assert session.cards == 30  # GB beyond the free quota, for the whole account
    assert session.rate == book.storage_per_gb_day
    # Growing a disk reopens the session at the new size (the old one settled and closed).
    disks.resize_disk(small, free + 10)
    sessions = list(_storage_sessions(funded).order_by("id"))
    assert [s.state for s in sessions] == ["closed", "open"]
    assert sessions[-1].cards == 40
    summary = disks.storage_summary(funded)
    assert summary.total_gb == free + 40
    assert summary.per_day == (book.storage_per_gb_day * 40).quantize(Decimal("0.01"))


def test_storage_charge_accrues_per_gb_day(sim_fleet, funded):
    from billing.settlement import settle_usage

    free = billing.current_price_book().storage_free_gb
    disks.create_disk(funded, name="big", size_gb=free + 100, region="xiamen")
    session = _storage_sessions(funded).get(state="open")
    before = billing.get_wallet_summary(funded).spendable
    settle_usage(session.started_at + timedelta(days=1))
    after = billing.get_wallet_summary(funded).spendable
    assert before - after == (session.rate * 100).quantize(Decimal("0.01"))


def test_resize_only_grows_and_size_limits(sim_fleet, funded, settings):
    disk = disks.create_disk(funded, name="d", size_gb=10, region="xiamen")
    with pytest.raises(disks.DiskRefused):
        disks.resize_disk(disk, 5)
    with pytest.raises(disks.DiskRefused):
        disks.create_disk(
            funded, name="huge", size_gb=settings.SLICES_DISK_MAX_GB + 1, region="xiamen"
        )
    with pytest.raises(disks.DiskRefused):
        disks.create_disk(funded, name="d", size_gb=10, region="atlantis")


def test_multi_attach_same_region_rw_and_ro(sim_fleet, funded):
    disk = disks.create_disk(funded, name="shared", size_gb=20, region="xiamen")
    a = make_instance(funded, region=disk.region)
    b = make_instance(funded, region=disk.region)
    disks.attach_disk(disk, a, "rw")
    disks.attach_disk(disk, b, "ro")
    modes = {att.instance_id: att.mode for att in disks.attachments_of(disk)}
    assert modes == {a.pk: "rw", b.pk: "ro"}
    with pytest.raises(disks.DiskRefused):
        disks.attach_disk(disk, a, "ro")  # once per instance


def test_attach_refuses_other_region_and_other_owner(sim_fleet, funded, bob):
    from slices.models import Region

    disk = disks.create_disk(funded, name="d", size_gb=20, region="xiamen")
    far = make_instance(funded, region=Region.objects.get(code="yinchuan"))
    with translation.override("en"), pytest.raises(disks.DiskRefused) as err:
        disks.attach_disk(disk, far)
    with translation.override("en"):
        assert "is in Xiamen and the instance in Yinchuan" in err.value.message()
    with pytest.raises(Http404):
        disks.attach_disk(disk, make_instance(bob, region=disk.region))
    with pytest.raises(Http404):
        disks.get_disk_for_user(bob, disk.public_id)


def test_disk_in_use_cannot_be_deleted(sim_fleet, funded):
    disk = disks.create_disk(funded, name="d", size_gb=20, region="xiamen")
    inst = make_instance(funded, region=disk.region)
    disks.attach_disk(disk, inst)
    with pytest.raises(disks.DiskInUse) as err:
        disks.delete_disk(disk)
    assert err.value.code == "conflict" and err.value.http_status == 409
    assert inst.name in err.value.message()
    disks.detach_disk(disk, inst)
    disks.delete_disk(disk)
    with pytest.raises(Http404):
        disks.get_disk_for_user(funded, disk.public_id)


def test_order_with_disks_attaches_and_release_keeps_them(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    disk = disks.create_disk(funded, name="ds", size_gb=80, region="xiamen")
    inst = run_order(
        funded, django_capture_on_commit_callbacks, disks=((str(disk.public_id), "ro"),)
    )
    assert inst.state == InstanceState.RUNNING
    assert inst.region.code == "xiamen"
    [att] = disks.instance_disks(inst)
    assert att.disk == disk and att.mode == "ro"
    logs = " ".join(inst.events.filter(kind="log").values_list("text", flat=True))
    assert disk.mount_path in logs
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(inst, by="alice")
    assert disks.instance_disks(inst) == []
    disk.refresh_from_db()
    assert disk.state == "available"  # survives the release
    disks.delete_disk(disk)  # and is free to delete now


def test_order_refuses_disk_in_other_region(sim_fleet, funded, django_capture_on_commit_callbacks):
    disk = disks.create_disk(funded, name="ds", size_gb=20, region="yinchuan")
    with pytest.raises(disks.DiskRefused):
        run_order(
            funded,
            django_capture_on_commit_callbacks,
            region="xiamen",
            disks=((str(disk.public_id), "rw"),),
        )


def test_storage_needs_funds_beyond_free(sim_fleet, alice):
    free = billing.current_price_book().storage_free_gb
    disks.create_disk(alice, name="free", size_gb=free, region="xiamen")  # free: no balance needed
    with pytest.raises(billing.InsufficientFunds):
        disks.create_disk(alice, name="paid", size_gb=100, region="xiamen")
