"""`manage.py load_fleet`: creates the inventory, is idempotent, rejects bad files with line + reason."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from slices.choices import NodeState
from slices.models import GPU, Cluster, Node, Region, ScalableUnit, SpineGroup
from tests.slices.factories import SMALL_FLEET

pytestmark = pytest.mark.django_db


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def _counts() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (Region, Cluster, SpineGroup, ScalableUnit, Node, GPU))


def test_load_fleet_creates_the_inventory_and_is_idempotent(tmp_path: Path) -> None:
    path = _write(tmp_path, SMALL_FLEET)
    call_command("load_fleet", path, stdout=StringIO())
    first = _counts()
    assert first == (2, 3, 8 + 1 + 8, 3 + 1 + 1, 24 + 2 + 8, (24 + 2 + 8) * 8)
    gpu = GPU.objects.get(node__hostname="xm-h8-su01-n01", index=5)
    assert (gpu.numa_node, gpu.hca) == (1, "mlx5_5")
    out = StringIO()
    call_command("load_fleet", path, stdout=out)
    assert _counts() == first
    assert "created nothing; updated nothing" in out.getvalue()


def test_load_fleet_updates_changed_nodes_and_keeps_removed_ones_out_of_service(
    tmp_path: Path,
) -> None:
    call_command("load_fleet", _write(tmp_path, SMALL_FLEET), stdout=StringIO())
    changed = SMALL_FLEET.replace('address: "10.11.{su}.{node}"', 'address: "10.99.{su}.{node}"')
    changed = changed.replace("scalable_units: [8]", "scalable_units: [6]")
    out = StringIO()
    call_command("load_fleet", _write(tmp_path, changed), stdout=out)
    assert Node.objects.get(hostname="xm-4090-r01-n01").address == "10.99.1.1"
    gone = Node.objects.get(hostname="yc-a8-su01-n08")
    assert gone.in_fleet_file is False and gone.state == NodeState.MAINTENANCE
    assert "no longer in the file" in out.getvalue()


def test_bad_fleet_file_is_rejected_with_line_and_reason_and_changes_nothing(
    tmp_path: Path,
) -> None:
    bad = SMALL_FLEET.replace("fabric: ethernet", "fabric: token-ring")
    with pytest.raises(CommandError) as err:
        call_command("load_fleet", _write(tmp_path, bad), stdout=StringIO())
    line = bad.splitlines().index("        fabric: token-ring") + 1
    assert f"fleet.yaml:{line}: fabric 'token-ring' is not one of" in str(err.value)
    assert Node.objects.count() == 0


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="No such file"):
        call_command("load_fleet", str(tmp_path / "nope.yaml"), stdout=StringIO())


def test_without_a_file_the_shipped_fleet_is_loaded() -> None:
    call_command("load_fleet", stdout=StringIO())
    assert GPU.objects.count() >= 6000
    assert set(Region.objects.values_list("code", flat=True)) == {"xiamen", "yinchuan", "ulanqab"}
    yc = Cluster.objects.get(code="yc-a800-1")
    assert list(yc.sus.values_list("capacity", flat=True)) == [20] * 12 + [16]
    assert yc.spine_groups.count() == 8
