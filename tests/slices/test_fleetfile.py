"""Reading fleet files: the shipped fleet parses; bad files name the line and the reason."""

from __future__ import annotations

import pytest

from slices.fleetfile import SHIPPED_FLEET, FleetFileError, load_fleet_file, parse_fleet

GOOD = """\
version: 1
gpu_models:
  - {code: H800, memory_gib: 80, nvlink_gbps: 200}
regions:
  - code: ulanqab
    name: Ulanqab
    clusters:
      - code: uq-1
        gpu_model: H800
        fabric: ib-hdr
        gpus_per_node: 8
        nodes: 56
        su_nodes: 20
        hostname: "uq-su{su:02d}-n{node:02d}"
        address: "10.0.{su}.{node}"
"""


def test_su_layout_is_full_sus_then_the_remainder() -> None:
    spec = parse_fleet(GOOD)
    assert [su.capacity for su in spec.clusters[0].sus] == [20, 20, 16]
    assert spec.clusters[0].sus[2].nodes[-1].hostname == "uq-su03-n16"


def test_ndr_example_describes_32_node_sus() -> None:
    from pathlib import Path

    spec = load_fleet_file(Path(SHIPPED_FLEET).parent / "example-ndr.yaml")
    assert {su.capacity for su in spec.clusters[0].sus} == {32}


@pytest.mark.parametrize(
    ("change", "line", "reason"),
    [
        (("fabric: ib-hdr", "fabric: infiniband"), 10, "fabric 'infiniband' is not one of"),
        (("gpu_model: H800", "gpu_model: B200"), 9, "unknown GPU model 'B200'"),
        (("su_nodes: 20", "su_nodes: 24"), 13, "does not fit a non-blocking ib-hdr leaf"),
        (("nodes: 56", "nodes: many"), 12, "'nodes' must be an integer"),
        (("version: 1", "version: 2"), 1, "unsupported version 2"),
        (
            ("    name: Ulanqab\n", "    name: Ulanqab\n    colour: red\n"),
            7,
            "unknown key 'colour'",
        ),
        (("{su:02d}-n{node:02d}", "{rack}"), 14, "bad name template"),
        (('address: "10.0.{su}.{node}"', 'address: "10.0.0.1"'), 15, "already used"),
        (("  - {code: H800", "  - {code: H800, code: A800"), 3, "duplicate key 'code'"),
        (("regions:", "regions: ["), 5, "not valid YAML"),
    ],
)
def test_bad_files_are_rejected_with_line_and_reason(
    change: tuple[str, str], line: int, reason: str
) -> None:
    text = GOOD.replace(*change)
    assert text != GOOD
    with pytest.raises(FleetFileError) as err:
        parse_fleet(text, source="fleet.yaml")
    assert err.value.line == line, str(err.value)
    assert reason in err.value.reason
    assert str(err.value).startswith(f"fleet.yaml:{line}: ")
