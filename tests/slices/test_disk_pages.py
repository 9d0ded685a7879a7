"""Storage pages and API: disks, the /pfs card, stop/start buttons, the checkpoint card."""

from __future__ import annotations

import pytest
from django.urls import reverse

from slices.choices import InstanceState
from slices.models import Disk, Instance
from slices.services import disks, storage
from tests.slices.factories import make_instance

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(sim_fleet, settings, tmp_path):
    """The small simulated fleet; the console's view of the PFS in ``tmp_path``, returned."""
    settings.SLICES_PFS_CONSOLE_ROOT = str(tmp_path / "pfs")
    return tmp_path / "pfs"


def test_create_disk_from_the_page_and_delete_in_use_is_refused(fleet, funded, alice_client):
    r = alice_client.post(
        reverse("slices:disk-list"), {"name": "datasets", "size_gb": 120, "region": "xiamen"}
    )
    disk = Disk.objects.get(created_by=funded)
    assert r.status_code == 302 and r["Location"] == reverse(
        "slices:disk-detail", args=[disk.public_id]
    )
    inst = make_instance(funded, region=disk.region, name="trainer")
    r = alice_client.post(
        reverse("slices:disk-attach", args=[disk.public_id]),
        {"instance": str(inst.public_id), "mode": "ro"},
    )
    page = alice_client.get(reverse("slices:disk-detail", args=[disk.public_id])).content.decode()
    assert "trainer" in page
    r = alice_client.post(reverse("slices:disk-delete", args=[disk.public_id]), follow=True)
    assert "trainer" in r.content.decode()  # the refusal names the instance using it
    assert Disk.objects.get(pk=disk.pk).state == "available"
    listing = alice_client.get(reverse("slices:disk-list")).content.decode()
    assert "datasets" in listing and "/pfs" in listing


def test_invalid_disk_form_shows_the_error(fleet, funded, alice_client):
    r = alice_client.post(
        reverse("slices:disk-list"), {"name": "x", "size_gb": 0, "region": "xiamen"}
    )
    assert r.status_code == 400
    assert not Disk.objects.exists()


def test_pfs_usage_is_measured_against_the_quota(fleet, funded, settings):
    settings.SLICES_PFS_QUOTA_GB = 1
    root = fleet / storage.account_dir(funded)
    (root / "data").mkdir(parents=True)
    (root / "data" / "a.bin").write_bytes(b"x" * 4096)
    (root / "data" / "b.bin").write_bytes(b"y" * 1024)
    summary = storage.measure_pfs(funded)
    assert summary.used_bytes == 5120 and summary.files == 2
    assert summary.quota_gb == 1 and not summary.over_quota
    assert storage.pfs_summary(funded).used_bytes == 5120  # kept


def test_instance_page_shows_stop_button_daily_amount_and_checkpoint(fleet, funded, alice_client):
    inst = make_instance(funded, cards=4, name="box")
    ckpt = fleet / storage.account_dir(funded) / "checkpoints" / inst.slug / "step-4200"
    ckpt.mkdir(parents=True)
    html = alice_client.get(
        reverse("slices:instance-detail", args=[inst.public_id])
    ).content.decode()
    assert 'id="stop-button"' in html
    per_day = str(disks.kept_disk_per_day(inst))
    assert per_day in html
    assert 'id="instance-checkpoint"' in html and "4200" in html
    Instance.objects.filter(pk=inst.pk).update(state=InstanceState.STOPPED)
    html = alice_client.get(
        reverse("slices:instance-detail", args=[inst.public_id])
    ).content.decode()
    assert 'id="start-gpuless-button"' in html and 'id="instance-stopped"' in html


def test_api_disks_and_order_with_disks(
    fleet, funded, alice_client, bob_client, django_capture_on_commit_callbacks
):
    r = alice_client.post(
        "/api/v1/disks/",
        {"name": "ds", "size_gb": 20, "region": "xiamen"},
        content_type="application/json",
    )
    assert r.status_code == 201, r.content
    disk_id = r.json()["id"]
    assert bob_client.get(f"/api/v1/disks/{disk_id}/").status_code == 404
    with django_capture_on_commit_callbacks(execute=True):
        r = alice_client.post(
            "/api/v1/instances/",
            {"gpu_model": "RTX4090", "cards": 1, "disks": [{"id": disk_id, "mode": "ro"}]},
            content_type="application/json",
        )
    assert r.status_code == 202, r.content
    inst_id = r.json()["id"]
    body = alice_client.get(f"/api/v1/instances/{inst_id}/").json()
    assert body["state"] == "running"
    assert body["disks"][0]["mode"] == "ro" and body["disks"][0]["path"].startswith("/data/")
    r = alice_client.delete(f"/api/v1/disks/{disk_id}/")
    assert r.status_code == 409 and r.json()["error"] == "conflict"
    r = alice_client.post(
        f"/api/v1/disks/{disk_id}/resize/", {"size_gb": 10}, content_type="application/json"
    )
    assert r.status_code == 400
    r = alice_client.post(
        f"/api/v1/disks/{disk_id}/resize/", {"size_gb": 40}, content_type="application/json"
    )
    assert r.status_code == 200 and r.json()["size_gb"] == 40
    storage_body = alice_client.get("/api/v1/storage/").json()
    assert storage_body["disks_gb"] == 40
    # stop and start through the API
    with django_capture_on_commit_callbacks(execute=True):
        r = alice_client.post(f"/api/v1/instances/{inst_id}/stop/")
    assert r.status_code == 202
    assert alice_client.get(f"/api/v1/instances/{inst_id}/").json()["state"] == "stopped"
    with django_capture_on_commit_callbacks(execute=True):
        r = alice_client.post(
            f"/api/v1/instances/{inst_id}/start/",
            {"mode": "gpuless"},
            content_type="application/json",
        )
    assert r.status_code == 202
    body = alice_client.get(f"/api/v1/instances/{inst_id}/").json()
    assert body["state"] == "running" and body["gpuless"] is True
