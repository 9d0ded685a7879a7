"""The cluster heat map's live frame, packed: what every operator watching a cluster gets once a
second. Pure: no Django.

A cluster of 2,048 GPUs as JSON rows (``{"nodes": {host: [[gpu, util, temp, power, mem], …]}}``)
is 49 KiB a second per watcher, compressed by the web server once per watcher
(permessage-deflate) and parsed by every browser as 10,000 numbers; ``bench/telemetry.py`` found
those per-watcher costs to be most of the latency at 50 watchers. Packed, the frame is the host
names and one base64 string of 7 bytes per GPU (24 KiB for 2,048 GPUs, 7 KiB deflated), at the
precision the pages show, in columns (they compress better than records):

=========== ============ ==========================================================================
bytes       type         what
=========== ============ ==========================================================================
H           u8           how many GPUs each host has (H: the number of hosts, in ``hosts`` order)
N           u8           every GPU's index on its node (N: the GPUs, host after host)
N           u8           utilisation, % (0–100)
N           u8           temperature, °C (clamped to 0–254)
2N          u16 LE       power, whole W (clamped to 0–65534)
2N          u16 LE       memory used, in units of 16 MiB (the pages show tenths of a GiB)
=========== ============ ==========================================================================

``NONE_8`` / ``NONE_16`` stand for "not read" (a lost GPU). ``static/slices/telemetry.js``
(``heatNodes``) reads it; ``unpack_nodes`` is the same reading in Python (the tests and the
benchmark's clients).
"""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

NONE_8 = 0xFF
NONE_16 = 0xFFFF
MEM_UNIT_MIB = 16
MAX_GPUS_PER_HOST = 255

# One GPU as the relay gathers it: index, util %, temp °C, power W, memory used MiB.
HeatRow = Sequence[Any]


def _u8(value: Any, hi: int) -> int:
    if value is None:
        return NONE_8
    return min(hi, max(0, round(value)))


def _column8(values: Sequence[Any], hi: int) -> bytes:
    # Whole numbers in range (what the relay's rows hold) as they are; anything else through _u8.
    return bytes([v if type(v) is int and 0 <= v <= hi else _u8(v, hi) for v in values])


def _column16(values: Sequence[Any], scale: float = 1.0) -> bytes:
    # Half up; out of range or not read through _u16. Called for 2,048 GPUs a second: inline.
    top = NONE_16 - 1
    column = array(
        "H",
        [
            int(x + 0.5) if v is not None and 0 <= (x := v / scale) <= top else _u16(v, scale)
            for v in values
        ],
    )
    if sys.byteorder == "big":
        column.byteswap()
    return column.tobytes()


def _u16(value: Any, scale: float = 1.0) -> int:
    if value is None:
        return NONE_16
    return min(NONE_16 - 1, max(0, round(value / scale)))


def pack_nodes(nodes: Mapping[str, Sequence[HeatRow]]) -> dict[str, Any]:
    """``{"hosts": [...], "packed": base64}`` for ``{host: [[gpu, util, temp, power, mem], …]}``."""
    counts: list[int] = []
    columns: list[list[Any]] = [[], [], [], [], []]
    for host, rows in nodes.items():
        if len(rows) > MAX_GPUS_PER_HOST:
            raise ValueError(f"{host}: {len(rows)} GPUs, at most {MAX_GPUS_PER_HOST}")
        counts.append(len(rows))
        if rows:
            for column, values in zip(columns, zip(*rows, strict=True), strict=True):
                column.extend(values)
    index, util, temp, power, mem = columns
    data = b"".join(
        (
            bytes(counts),
            _column8(index, MAX_GPUS_PER_HOST - 1),
            _column8(util, 100),
            _column8(temp, 254),
            _column16(power),
            _column16(mem, MEM_UNIT_MIB),
        )
    )
    return {"hosts": list(nodes), "packed": base64.b64encode(data).decode("ascii")}


def unpack_nodes(payload: dict[str, Any]) -> dict[str, list[list[Any]]]:
    """The rows back (memory in MiB, to 16 MiB); a frame in the older JSON-rows shape as it is."""
    if "packed" not in payload:
        return payload.get("nodes") or {}
    data = base64.b64decode(payload["packed"], validate=True)
    hosts = payload["hosts"]
    h = len(hosts)
    counts = data[:h]
    n = sum(counts)
    if len(counts) != h or len(data) != h + 7 * n:
        raise ValueError("a packed heat-map frame of the wrong length")
    index, util, temp = data[h : h + n], data[h + n : h + 2 * n], data[h + 2 * n : h + 3 * n]
    power, mem = array("H"), array("H")
    power.frombytes(data[h + 3 * n : h + 5 * n])
    mem.frombytes(data[h + 5 * n :])
    if sys.byteorder == "big":
        power.byteswap()
        mem.byteswap()
    nodes: dict[str, list[list[Any]]] = {}
    at = 0
    for host, count in zip(hosts, counts, strict=True):
        nodes[host] = [
            [
                index[i],
                None if util[i] == NONE_8 else util[i],
                None if temp[i] == NONE_8 else temp[i],
                None if power[i] == NONE_16 else power[i],
                None if mem[i] == NONE_16 else mem[i] * MEM_UNIT_MIB,
            ]
            for i in range(at, at + count)
        ]
        at += count
    return nodes
