"""Tenant-isolation registry for slices (see tests/console/test_tenant_isolation.py)."""

from __future__ import annotations

from typing import Any

from slices.models import Node
from tests.slices.factories import load_small_fleet, make_instance


def _node(owner: Any) -> dict[str, Any]:
    if not Node.objects.exists():
        load_small_fleet()
    return {"public_id": Node.objects.order_by("pk").values_list("public_id", flat=True).first()}


def _instance(owner: Any) -> dict[str, Any]:
    return {"public_id": make_instance(owner).public_id}


def _disk(owner: Any) -> dict[str, Any]:
    from slices.models import Disk, Region

    if not Region.objects.exists():
        load_small_fleet()
    disk = Disk.objects.create(
        team=owner.personal_team,
        created_by=owner,
        region=Region.objects.first(),
        name="d",
        size_gb=10,
    )
    return {"public_id": disk.public_id}


def _web_port(owner: Any) -> dict[str, Any]:
    from tests.support.apphosts import APP_PORT, running_with_port

    return {"public_id": running_with_port(owner).public_id, "port": APP_PORT}


def _web_port_path(owner: Any) -> dict[str, Any]:
    return {**_web_port(owner), "rest": "page"}


def _share_link(owner: Any) -> dict[str, Any]:
    from slices.services import ports
    from tests.support.apphosts import APP_PORT, running_with_port

    instance = running_with_port(owner)
    link, _secret = ports.create_share_link(owner, instance, APP_PORT)
    return {"public_id": instance.public_id, "link_id": link.pk}


def _job(owner: Any) -> dict[str, Any]:
    from slices.models import SlurmJob

    instance = make_instance(owner)
    job = SlurmJob.objects.create(instance=instance, slurm_id=1, name="j", script="#!/bin/sh\n")
    return {"public_id": instance.public_id, "job_id": job.public_id}


def _reservation(owner: Any) -> dict[str, Any]:
    """A booked window of ``owner``'s team (a row: no GPUs held, nothing paid)."""
    from datetime import timedelta
    from decimal import Decimal

    from django.utils import timezone

    from console.tenancy import personal_team
    from slices.models import GpuModel, Region, Reservation

    if not GpuModel.objects.exists():
        load_small_fleet()
    start = timezone.now() + timedelta(days=2)
    row = Reservation.objects.create(
        team=personal_team(owner),
        created_by=owner,
        name="w",
        gpu_model=GpuModel.objects.get(code="RTX4090"),
        region=Region.objects.get(code="xiamen"),
        cards=1,
        starts_at=start,
        hours=1,
        ends_at=start + timedelta(hours=1),
        rate_per_card_hour=Decimal("1.90"),
        total=Decimal("1.90"),
    )
    return {"public_id": row.public_id}


OBJECT_ROUTES: dict = {
    # Booked windows (issue 32).
    "reservation-detail": _reservation,
    "reservation-cancel": _reservation,
    "slices:reservation-cancel": _reservation,
    # A slice's Slurm jobs (issue 31).
    "job-list": _instance,
    "job-detail": _job,
    "job-cancel": _job,
    "slices:instance-jobs": _instance,
    "slices:instance-job": _job,
    "slices:instance-job-cancel": _job,
    # Web ports (issues 19, 29): the console's routes answer 404 to anyone but the owner, whom
    # they only send on to the port's own host.
    "slices:instance-port": _web_port,
    "slices:instance-port-path": _web_port_path,
    "slices:instance-port-open": _web_port,
    "slices:instance-share-link-create": _web_port,
    "slices:instance-share-link-revoke": _share_link,
    "slices:instance-stop": _instance,
    "slices:instance-start": _instance,
    "slices:instance-migration-choice": _instance,
    "slices:disk-detail": _disk,
    "slices:disk-resize": _disk,
    "slices:disk-delete": _disk,
    "slices:disk-attach": _disk,
    "slices:disk-detach": _disk,
    "instance-stop": _instance,
    "instance-start": _instance,
    "disk-detail": _disk,
    "disk-resize": _disk,
    "disk-attach": _disk,
    "disk-detach": _disk,
    "slices:instance-detail": _instance,
    "slices:instance-release": _instance,
    "instance-detail": _instance,
    "instance-release": _instance,
    "instance-events": _instance,
    "instance-logs": _instance,
    "telemetry:instance-history": _instance,
    "telemetry:instance-csv": _instance,
}


def _instance_ws(owner: Any) -> str:
    return f"/ws/instances/{make_instance(owner).public_id}/"


def _telemetry_ws(owner: Any) -> str:
    return f"/ws/telemetry/instances/{make_instance(owner).public_id}/"


def _terminal_ws(owner: Any) -> str:
    """A running simulated instance with a node at rank 0 (the terminal opens a simulated shell)."""
    from slices.models import InstanceNode

    instance = make_instance(owner)
    node = Node.objects.filter(gpu_model=instance.gpu_model).order_by("pk").first()
    InstanceNode.objects.create(
        instance=instance, node=node, rank=0, hostname=node.hostname, gpu_mask=1
    )
    return f"/ws/instances/{instance.public_id}/terminal/"  # rank 0 by default


def _web_port_ws(owner: Any) -> str:
    from tests.support.apphosts import APP_PORT, running_with_port

    return f"/instances/{running_with_port(owner).public_id}/ports/{APP_PORT}/ws/echo"


# Relayed only on the port's own host: the console's host refuses even the owner (issue 29).
_web_port_ws.owner_connects = False  # type: ignore[attr-defined]


WEBSOCKET_ROUTES: dict = {
    "instances/<uuid:public_id>/ports/<int:port>/<path:rest>": _web_port_ws,
    "ws/instances/<uuid:public_id>/": _instance_ws,
    "ws/instances/<uuid:public_id>/terminal/": _terminal_ws,
    "ws/telemetry/instances/<uuid:public_id>/": _telemetry_ws,
}

# Operator pages: a customer never gets a 2xx (the node is fleet inventory, not a customer object).
STAFF_ROUTES = {"slices:ops-node": _node}

EXEMPT_ROUTES: dict[str, str] = {
    "slices:ops-cluster": "a cluster code on an operator-only page (covered by tests/slices/test_ops_pages.py)",
    "slices:app-detail": "an AI app's slug of the public catalogue (prices are public)",
    "slices:app-api": "an AI app's API takes the app's own key, never a session: every session, the "
    "owner's included, gets 401 without it; another instance's key gets 401 "
    "(tests/slices/test_apps.py)",
}
