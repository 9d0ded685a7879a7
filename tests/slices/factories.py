"""A small fleet for the database tests: loaded through the real fleet-file path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from console.models import User
from slices import services
from slices.fleetfile import parse_fleet
from slices.models import Instance
from slices.services import load_fleet

SMALL_FLEET = """\
version: 1
gpu_models:
  - {code: H800, memory_gib: 80, nvlink_gbps: 200}
  - {code: A800, memory_gib: 80, nvlink_gbps: 200}
  - {code: RTX4090, memory_gib: 24}
demand:
  H800: {8: 1, 64: 4, 128: 2}
regions:
  - code: xiamen
    name: Xiamen
    name_zh: 厦门
    clusters:
      - code: xm-h800
        gpu_model: H800
        fabric: ib-hdr
        gpus_per_node: 8
        scalable_units: [8, 8, 8]
        hostname: "xm-h8-su{su:02d}-n{node:02d}"
        address: "10.12.{su}.{node}"
      - code: xm-4090
        gpu_model: RTX4090
        fabric: ethernet
        gpus_per_node: 8
        nodes: 2
        su_nodes: 2
        hostname: "xm-4090-r{su:02d}-n{node:02d}"
        address: "10.11.{su}.{node}"
  - code: yinchuan
    name: Yinchuan
    name_zh: 银川
    clusters:
      - code: yc-a800
        gpu_model: A800
        fabric: ib-hdr
        gpus_per_node: 8
        scalable_units: [8]
        hostname: "yc-a8-su{su:02d}-n{node:02d}"
        address: "10.21.{su}.{node}"
"""


def load_small_fleet(text: str = SMALL_FLEET) -> None:
    load_fleet(parse_fleet(text))


def make_instance(owner, **fields):
    """An instance row of ``owner``'s personal team (or ``team=``), made by ``owner`` (no GPUs
    held): for pages and isolation checks."""
    from decimal import Decimal

    from slices.models import GpuModel, Instance

    if not GpuModel.objects.exists():
        load_small_fleet()
    values = {
        "name": "box",
        "kind": "host",
        "gpu_model": GpuModel.objects.get(code="RTX4090"),
        "cards": 1,
        "quoted_per_hour": Decimal("1.90"),
        "state": "running",
        "driver": "sim",
        **fields,
    }
    from console.tenancy import personal_team

    values.setdefault("team", personal_team(owner))
    return Instance.objects.create(created_by=owner, **values)


def run_order(user: User, capture: Callable[..., Any], **kw: Any) -> Instance:
    """Order (8 × RTX4090 unless ``kw`` says otherwise) with the on-commit callbacks run, so the
    simulated provisioning completes; the instance as it then is."""
    req = services.OrderRequest(**{"gpu_model": "RTX4090", "cards": 8, **kw})
    with capture(execute=True):
        instance, _created = services.order_instance(user, req)
    instance.refresh_from_db()
    return instance
