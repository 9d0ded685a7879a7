"""The cluster heat map's packed live frame (slices.telemetry.heat): what the relay sends every
operator once a second, read back as the pages read it."""

from __future__ import annotations

import base64
import json

import pytest

from slices.telemetry.heat import pack_nodes, unpack_nodes
from slices.telemetry.relay import Relay
from slices.telemetry.ring import MemoryRing


def _cluster(hosts: int = 256, gpus: int = 8) -> dict[str, list[list[object]]]:
    return {
        f"yc-a8-su{h // 16 + 1:02d}-n{h % 16 + 1:02d}": [
            [i, 90 + (h + i) % 10, 30 + i, 371.3 + i, 74547.4 + 37 * i] for i in range(gpus)
        ]
        for h in range(hosts)
    }


def test_a_cluster_frame_reads_back_at_the_precision_the_pages_show() -> None:
    nodes = _cluster()
    packed = pack_nodes(nodes)
    back = unpack_nodes(packed)
    assert list(back) == list(nodes)  # host order kept
    for host, rows in nodes.items():
        for (gpu, util, temp, power, mem), got in zip(rows, back[host], strict=True):
            assert got[:3] == [gpu, util, temp]
            assert got[3] == round(power)  # whole watts (the pages round them)
            assert abs(got[4] - mem) <= 8  # 16 MiB steps (the pages show tenths of a GiB)
    # Half the size of the JSON rows it replaced, at 2,048 GPUs.
    rows = json.dumps({"nodes": nodes}, separators=(",", ":"))
    assert len(json.dumps(packed, separators=(",", ":"))) < len(rows) / 2


def test_lost_gpus_partial_nodes_and_out_of_range_values() -> None:
    nodes = {
        "a": [[0, None, None, None, None], [5, 100, 254, 65534, 16 * 65534]],
        "b": [],
        "c": [[3, -4, -10, -1.0, -20.0], [63, 250, 900, 1e9, 1 << 24]],
    }
    back = unpack_nodes(pack_nodes(nodes))
    assert back == {
        "a": [[0, None, None, None, None], [5, 100, 254, 65534, 16 * 65534]],
        "b": [],
        "c": [[3, 0, 0, 0, 0], [63, 100, 254, 65534, 16 * 65534]],  # clamped, never "not read"
    }


def test_a_frame_of_the_wrong_length_is_refused() -> None:
    packed = pack_nodes({"a": [[0, 1, 2, 3, 4]]})
    data = base64.b64decode(packed["packed"])
    short = {**packed, "packed": base64.b64encode(data[:-1]).decode()}
    with pytest.raises(ValueError, match="wrong length"):
        unpack_nodes(short)
    with pytest.raises(ValueError, match="at most 255"):
        pack_nodes({"a": [[0, 1, 2, 3, 4]] * 256})


def test_the_older_json_rows_read_as_they_are() -> None:
    nodes = {"a": [[0, 1, 2, 3.5, 4]]}
    assert unpack_nodes({"nodes": nodes}) == nodes


def test_the_relay_refuses_an_unknown_heat_format() -> None:
    with pytest.raises(ValueError, match="heat_format"):
        Relay(MemoryRing(), layer=None, heat_format="csv")
