"""The last hour of each instance's samples at 1 s: a bounded ring per instance.

Production keeps it in Redis streams capped with ``MAXLEN ~`` (every web server reads the same
ring the relay writes); the embedded default keeps it in memory, in the one process that both
samples and serves. A page that opens or reconnects draws from here at once, then follows the
live stream. Entries are small dicts: ``{"ts": float, "seq": int, "sim": bool, "g": [rows]}``.
Pure: no Django (the relay picks the ring from settings).
"""

from __future__ import annotations

import json
import math
import threading
from collections import deque
from typing import Any, Protocol

Entry = dict[str, Any]


def ring_key(instance_id: str) -> str:
    return f"telemetry:ring:{instance_id}"


class Ring(Protocol):
    def append_many(self, entries: dict[str, Entry]) -> None:
        """Append one entry to each instance's ring (key: the instance's public id)."""
        ...

    def since(self, instance_id: str, ts: float | None = None) -> list[Entry]:
        """Entries newer than ``ts`` (all kept when None), oldest first."""
        ...

    def drop(self, instance_id: str) -> None: ...

    def publish_latest(self, snapshots: dict[str, Entry]) -> None:
        """Replace each instance's latest full sample (what /metrics exports)."""
        ...

    def latest(self) -> dict[str, Entry]:
        """Every instance's latest full sample."""
        ...


LATEST_KEY = "telemetry:latest"
MAX_STREAM_MS = 2**63  # a Redis stream ID's milliseconds are below 2**64; this is far beyond


class MemoryRing:
    """A deque per instance, ``maxlen`` entries; thread-safe (the relay writes, views read)."""

    def __init__(self, maxlen: int = 3600) -> None:
        self.maxlen = maxlen
        self._rings: dict[str, deque[Entry]] = {}
        self._latest: dict[str, Entry] = {}
        self._lock = threading.Lock()

    def append_many(self, entries: dict[str, Entry]) -> None:
        with self._lock:
            for instance_id, entry in entries.items():
                ring = self._rings.get(instance_id)
                if ring is None:
                    ring = self._rings[instance_id] = deque(maxlen=self.maxlen)
                ring.append(entry)

    def since(self, instance_id: str, ts: float | None = None) -> list[Entry]:
        with self._lock:
            ring = self._rings.get(instance_id)
            if not ring:
                return []
            if ts is None:
                return list(ring)
            newer: list[Entry] = []
            for entry in reversed(ring):  # the newest are at the right: stop at the first old one
                if entry["ts"] <= ts:
                    break
                newer.append(entry)
        newer.reverse()
        return newer

    def drop(self, instance_id: str) -> None:
        with self._lock:
            self._rings.pop(instance_id, None)
            self._latest.pop(instance_id, None)

    def publish_latest(self, snapshots: dict[str, Entry]) -> None:
        with self._lock:
            self._latest.update(snapshots)

    def latest(self) -> dict[str, Entry]:
        with self._lock:
            return dict(self._latest)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(r) for r in self._rings.values())


class RedisRing:
    """A Redis stream per instance, trimmed to about ``maxlen`` entries on every append.

    Entry ids are the sample time in milliseconds (``<ms>-*``), so "since ts" is one XRANGE from
    an exclusive start. The key expires an hour after the last append, so a released instance's
    ring goes away by itself.
    """

    def __init__(
        self, client: Any, maxlen: int = 3600, ttl_seconds: int = 3600, *, approximate: bool = True
    ) -> None:
        self.client = client
        self.maxlen = maxlen
        self.ttl = ttl_seconds
        # "~": Redis trims whole macro nodes, cheaply, keeping at least maxlen (at most ~100 more).
        self.approximate = approximate
        self._last_ms: dict[str, int] = {}

    def append_many(self, entries: dict[str, Entry]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for instance_id, entry in entries.items():
            key = ring_key(instance_id)
            # Stream ids must grow: a repeated or older timestamp gets the next free id.
            ms = max(int(entry["ts"] * 1000), self._last_ms.get(instance_id, 0) + 1)
            self._last_ms[instance_id] = ms
            pipe.xadd(
                key,
                {"d": json.dumps(entry, separators=(",", ":"))},
                id=f"{ms}-0",
                maxlen=self.maxlen,
                approximate=self.approximate,
            )
            pipe.expire(key, self.ttl)
        # An id below the stream's last (another relay wrote ahead) fails that XADD only.
        pipe.execute(raise_on_error=False)

    def since(self, instance_id: str, ts: float | None = None) -> list[Entry]:
        if ts is not None and (math.isnan(ts) or ts < 0):
            ts = None  # before every entry (a stream ID is never negative)
        if ts is not None and not ts * 1000 < MAX_STREAM_MS:
            return []  # after every entry (``?since=1e300`` made an ID Redis refuses: a 500)
        start = "-" if ts is None else f"({int(ts * 1000)}-0"
        rows = self.client.xrange(ring_key(instance_id), min=start, max="+")
        entries = [
            json.loads(fields[b"d"] if b"d" in fields else fields["d"]) for _, fields in rows
        ]
        if ts is not None:
            entries = [e for e in entries if e["ts"] > ts]
        return entries[-self.maxlen :]

    def drop(self, instance_id: str) -> None:
        self.client.delete(ring_key(instance_id))
        self.client.hdel(LATEST_KEY, instance_id)
        self._last_ms.pop(instance_id, None)

    def publish_latest(self, snapshots: dict[str, Entry]) -> None:
        if snapshots:
            self.client.hset(
                LATEST_KEY,
                mapping={k: json.dumps(v, separators=(",", ":")) for k, v in snapshots.items()},
            )

    def latest(self) -> dict[str, Entry]:
        raw = self.client.hgetall(LATEST_KEY)
        return {(k.decode() if isinstance(k, bytes) else k): json.loads(v) for k, v in raw.items()}
