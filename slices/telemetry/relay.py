"""The relay: once a second, every running instance's GPU samples go to the browsers, the ring and
the minute rollups.

For each running instance it holds one telemetry source per node from the instance's driver (the
agent's stream over SSH, or the simulated workload), reads the latest sample of each, and

- appends one compact entry per instance to its ring (the last hour at 1 s),
- sends it to the channel-layer group ``telemetry.instance.<uuid>`` (the instance page), and one
  message per cluster to ``telemetry.cluster.<code>`` (the operators' heat map and node pages;
  packed, ``slices.telemetry.heat``: every watcher's server-side and browser-side cost grows with
  its size),
- publishes the latest full sample per instance (what ``/metrics`` exports),
- folds it into 1-minute rollups, written to the database when each minute ends (one row per GPU
  per minute, never per second).

Each tick times its stages (``TickStats.stages``: sources, parsing, encoding, the channel layer,
the rollups and ring); ``bench/telemetry.py`` prints them with the web server's and the clients'
share of each sample's way to a browser.

The embedded default runs it as a thread of the web process (``start_relay_thread``); production
runs ``manage.py relay_telemetry`` as its own process (the Procfile's ``telemetry``).

A Redis outage (the ring, ``/metrics``' snapshot and the channel layer all live there) does not
stop it: it keeps sampling on its cadence and writing the minute rollups to the database, logs one
warning when Redis goes and one line when it is back, and sends again from the first tick that
reaches it (redis-py reconnects by itself). Every Redis call is bounded (``REDIS_TIMEOUT_SECONDS``),
so a Redis that hangs instead of refusing delays a tick, never stops the loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections

from console import layer_loop
from console.retries import TRANSIENT_ERRORS
from slices.choices import InstanceState
from slices.drivers import capabilities, get_driver
from slices.drivers.base import TelemetrySource
from slices.models import Instance
from slices.services.provisioning import build_spec
from slices.services.telemetry import write_rollups
from slices.telemetry.groups import cluster_group, instance_group
from slices.telemetry.heat import pack_nodes
from slices.telemetry.ring import Ring
from slices.telemetry.rollup import MinuteAccumulator
from slices.telemetry.samples import (
    ROW_COLUMNS,
    NodeSample,
    SampleError,
    gpu_row,
    parse_sample,
)
from slices.telemetry.store import REDIS_TIMEOUT_SECONDS, get_ring

logger = logging.getLogger(__name__)

# Instances with more GPUs than this get no per-GPU detail in live messages (the table would be
# unreadable and the message large); their charts still get every GPU's row.
DETAIL_MAX_GPUS = 64
REFRESH_EVERY_TICKS = 5
# What an outage raises (Redis or the database unreachable), and our own timeout on a hung Redis.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, TimeoutError)


def _source(driver: Any, spec: Any, node: Any, gpu_model: str) -> TelemetrySource:
    """A node's telemetry: the driver's own (the simulated workload) or, for real nodes, the
    agent started over SSH."""
    kind = capabilities(driver.name).telemetry
    if kind == "driver":
        return driver.telemetry(spec, node, gpu_model)
    if kind == "agent":
        from slices.drivers.ssh_telemetry import SshAgentSource  # paramiko: only with that driver

        return SshAgentSource(driver, spec, node, interval=settings.TELEMETRY_INTERVAL)
    raise TypeError(f"the {driver.name!r} driver has no telemetry")


@dataclass
class _NodeFeed:
    rank: int
    host: str
    cluster: str
    source: TelemetrySource
    source_gpus: tuple[int, ...] = ()
    last_xid: dict[int, int] = field(default_factory=dict)


@dataclass
class _InstanceFeed:
    public_id: str
    hosts: list[str]
    nodes: list[_NodeFeed]
    simulated: bool


# What a tick spends its time on, in order: the sources' latest lines, checking them and building
# the rows, encoding the live messages, the channel layer taking them, and the minute rollups,
# ring entries and /metrics snapshot. Only the first four stand between a sample and a browser.
TICK_STAGES = ("source", "parse", "encode", "send", "record")


@dataclass
class TickStats:
    instances: int = 0
    gpus: int = 0
    bad_samples: int = 0
    rollups_written: int = 0
    # Seconds per stage of the tick (``TICK_STAGES``), for ``bench/telemetry.py`` and debugging.
    stages: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TICK_STAGES, 0.0))
    sent_at: float = 0.0  # wall-clock time the live messages were all with the channel layer


def _message(payload: dict[str, Any]) -> dict[str, Any]:
    """A channel-layer message carrying the payload already encoded: every consumer forwards the
    same text, so 50 watchers of a cluster cost one JSON encoding, not 50."""
    return {"type": "telemetry.sample", "text": json.dumps(payload, separators=(",", ":"))}


@dataclass
class _Frame:
    """What one tick gathers before it sends and records: ring entries by instance, the live
    payloads by group, the heat map by cluster and host, and the parsed samples."""

    now: float
    seq: int
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    live: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    clusters: dict[str, dict[str, list[list[Any]]]] = field(default_factory=dict)
    parsed: list[tuple[_InstanceFeed, _NodeFeed, NodeSample]] = field(default_factory=list)


def _read_node(node: _NodeFeed, now: float, stats: TickStats) -> NodeSample | None:
    """The node's latest sample; None (counted as bad) when it is malformed or the source fails."""
    try:
        t0 = time.perf_counter()
        raw = node.source.read(now)
        stats.stages["source"] += time.perf_counter() - t0
        if raw is None:
            return None
        return parse_sample(raw, simulated=node.source.simulated)
    except SampleError as exc:
        stats.bad_samples += 1
        logger.debug("bad sample from %s: %s", node.host, exc)
    except Exception:
        stats.bad_samples += 1
        logger.exception("telemetry source of %s failed", node.host)
    return None


# How a cluster's heat map travels: "packed" (slices.telemetry.heat, what the pages read) or
# "rows", the JSON rows it replaced, kept for ``bench/telemetry.py --compare``.
HEAT_FORMATS = ("packed", "rows")


class Relay:
    def __init__(
        self, ring: Ring | None = None, *, layer: Any = None, heat_format: str = "packed"
    ) -> None:
        if heat_format not in HEAT_FORMATS:
            raise ValueError(f"heat_format must be one of {HEAT_FORMATS}, not {heat_format!r}")
        self.ring = ring if ring is not None else get_ring()
        self.layer = layer if layer is not None else get_channel_layer()
        self.heat_format = heat_format
        self.feeds: dict[str, _InstanceFeed] = {}
        self.rollups = MinuteAccumulator()
        self.seq = 0
        self._minute: int | None = None
        self.outages: dict[str, float] = {}  # "redis" / "database": monotonic time it went away

    # -- which instances -----------------------------------------------------------------------
    def refresh(self) -> None:
        """Start sources for newly running instances; stop those of instances no longer running."""
        running = {
            str(i.public_id): i
            for i in Instance.objects.filter(state=InstanceState.RUNNING).select_related(
                "gpu_model"
            )
        }
        for public_id in list(self.feeds):
            if public_id not in running:
                self._stop(public_id)
        for public_id, instance in running.items():
            if public_id not in self.feeds:
                try:
                    self.feeds[public_id] = self._start(instance)
                except Exception:  # one instance's driver trouble must not stop the fleet's feed
                    logger.exception("telemetry for %s could not start", public_id)

    def _start(self, instance: Instance) -> _InstanceFeed:
        spec = build_spec(instance)
        driver: Any = get_driver(instance.driver or None)
        clusters = dict(
            instance.nodes.select_related("node__cluster").values_list(
                "rank", "node__cluster__code"
            )
        )
        nodes = [
            _NodeFeed(
                rank=n.rank,
                host=n.hostname,
                cluster=str(clusters.get(n.rank, "")),
                source=_source(driver, spec, n, instance.gpu_model.code),
                source_gpus=n.gpus,
            )
            for n in spec.nodes
        ]
        return _InstanceFeed(
            public_id=str(instance.public_id),
            hosts=[n.hostname for n in spec.nodes],
            nodes=nodes,
            simulated=capabilities(driver.name).simulated,
        )

    def _stop(self, public_id: str) -> None:
        feed = self.feeds.pop(public_id)
        for node in feed.nodes:
            try:
                node.source.close()
            except Exception:
                logger.debug("closing a telemetry source failed", exc_info=True)
        try:
            self.ring.drop(public_id)
        except OUTAGE_ERRORS as exc:  # Redis away: the ring's key expires by itself
            logger.debug("dropping the ring of %s failed: %r", public_id, exc)

    def close(self) -> None:
        for public_id in list(self.feeds):
            self._stop(public_id)

    # -- one second ------------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> TickStats:
        now = time.time() if now is None else now
        self.seq += 1
        stats = TickStats(instances=len(self.feeds))
        stages = stats.stages
        frame = _Frame(now=now, seq=self.seq)
        t0 = time.perf_counter()
        for feed in self.feeds.values():
            self._read_feed(feed, frame, stats)
        t1 = time.perf_counter()
        stages["parse"] = t1 - t0 - stages["source"]
        # The clusters' messages first: every operator watching a cluster waits on them.
        packed = self.heat_format == "packed"
        sends = [
            (
                cluster_group(code),
                _message(
                    {
                        "ts": round(now, 3),
                        "seq": self.seq,
                        **(pack_nodes(nodes) if packed else {"nodes": nodes}),
                    }
                ),
            )
            for code, nodes in frame.clusters.items()
        ]
        sends += [(group, _message(payload)) for group, payload in frame.live]
        t2 = time.perf_counter()
        stages["encode"] = t2 - t1
        # Browsers first (latency); then the rollups, the ring and the /metrics snapshot. Redis
        # being away loses this second's live point and ring entry, never the rollups.
        failure: BaseException | None = None
        if sends and self.layer is not None:
            # On the process's one layer loop (console.layer_loop): no new thread, event loop
            # and Redis connection every second. _send_all bounds itself; the margin is ours.
            try:
                failure = layer_loop.run(self._send_all(sends), timeout=REDIS_TIMEOUT_SECONDS + 1)
            except TimeoutError as exc:
                failure = exc
        stats.sent_at = time.time()
        t3 = time.perf_counter()
        stages["send"] = t3 - t2
        latest = self._record(frame)
        if frame.entries:
            try:
                self.ring.append_many(frame.entries)
                self.ring.publish_latest(latest)
            except OUTAGE_ERRORS as exc:
                failure = exc
        minute = int(now // 60)
        if self._minute is not None and minute != self._minute:
            stats.rollups_written = self.flush_rollups(now)
        self._minute = minute
        if failure is not None:
            self._unavailable("redis", failure)
        elif frame.entries or sends:
            self._available("redis")
        stages["record"] = time.perf_counter() - t3
        return stats

    def _unavailable(self, what: str, exc: BaseException) -> None:
        """One warning when an outage starts (not a traceback a second)."""
        if what not in self.outages:
            self.outages[what] = time.monotonic()
            text = str(exc).strip().splitlines()
            logger.warning(
                "telemetry relay: %s unavailable (%s: %s); sampling on, retrying every tick",
                what,
                type(exc).__name__,
                text[0] if text else "",
            )

    def _available(self, what: str) -> None:
        since = self.outages.pop(what, None)
        if since is not None:
            logger.warning("telemetry relay: %s back after %.0f s", what, time.monotonic() - since)

    def _read_feed(self, feed: _InstanceFeed, frame: _Frame, stats: TickStats) -> None:
        """Read every node of one instance: its ring entry, its live message, the heat map."""
        rows: list[list[Any]] = []
        detail: list[dict[str, Any]] = []
        problems: list[dict[str, str]] = []
        small = sum(len(n.source_gpus) for n in feed.nodes) <= DETAIL_MAX_GPUS
        for node in feed.nodes:
            sample = _read_node(node, frame.now, stats)
            if sample is None:
                continue
            if sample.state != "ok":
                problems.append({"host": node.host, "state": sample.state, "error": sample.error})
                continue
            frame.parsed.append((feed, node, sample))
            heat = frame.clusters.setdefault(node.cluster, {}).setdefault(node.host, [])
            for gpu in sample.gpus:
                row = gpu_row(node.rank, gpu)
                rows.append(row)
                heat.append([gpu.index, row[2], row[4], row[5], row[3]])
                if small:
                    detail.append({"node": node.rank, **gpu.detail()})
        stats.gpus += len(rows)
        entry: dict[str, Any] = {"ts": round(frame.now, 3), "seq": frame.seq, "g": rows}
        if feed.simulated:
            entry["sim"] = True
        if problems:
            entry["problems"] = problems
        frame.entries[feed.public_id] = entry
        live = dict(entry)
        if small:
            live["detail"] = detail
        frame.live.append((instance_group(feed.public_id), live))

    def _record(self, frame: _Frame) -> dict[str, dict[str, Any]]:
        """Fold the samples into the minute rollups; the latest full sample per instance."""
        latest: dict[str, dict[str, Any]] = {}
        for feed, node, sample in frame.parsed:
            full = latest.setdefault(
                feed.public_id, {"ts": round(frame.now, 3), "sim": feed.simulated, "gpus": []}
            )["gpus"]
            for gpu in sample.gpus:
                self.rollups.add(feed.public_id, node.host, gpu, frame.now, feed.simulated)
                if gpu.xid:
                    node.last_xid[gpu.index] = gpu.xid[-1]
                full.append(
                    {
                        **gpu.detail(),
                        "host": node.host,
                        "util": gpu.util_gpu,
                        "mem_used": gpu.mem_used_mib,
                        "temp": gpu.temp_c,
                        "power": gpu.power_w,
                        "last_xid": node.last_xid.get(gpu.index, 0),
                    }
                )
        return latest

    async def _send_all(self, sends: list[tuple[str, dict[str, Any]]]) -> BaseException | None:
        """Send every group its message, within ``REDIS_TIMEOUT_SECONDS``; the outage error that
        stopped any of them (the layer may also drop a message: the ring has it)."""
        try:
            async with asyncio.timeout(REDIS_TIMEOUT_SECONDS):
                results = await asyncio.gather(
                    *(self.layer.group_send(group, message) for group, message in sends),
                    return_exceptions=True,
                )
        except TimeoutError as exc:
            return exc
        outage: BaseException | None = None
        for result in results:
            if isinstance(result, OUTAGE_ERRORS):
                outage = result
            elif isinstance(result, Exception):
                logger.debug("telemetry broadcast dropped: %r", result)
        return outage

    def flush_rollups(self, now: float | None = None) -> int:
        """Write the finished minutes (all of them when ``now`` is None)."""
        records = self.rollups.flush(now)
        return write_rollups(records) if records else 0

    # -- the loop ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event, interval: float | None = None) -> None:
        """Tick every ``interval`` seconds on a steady cadence until ``stop`` is set."""
        interval = interval or settings.TELEMETRY_INTERVAL
        next_at = time.monotonic()
        ticks = 0
        while not stop.is_set():
            try:
                if ticks % REFRESH_EVERY_TICKS == 0:
                    close_old_connections()
                    self.refresh()
                    self._available("database")
                self.tick()
            except OUTAGE_ERRORS as exc:  # mostly the database: tick handles Redis itself
                database = isinstance(exc, (OperationalError, InterfaceError))
                self._unavailable("database" if database else "redis", exc)
            except Exception:  # keep sampling: one bad tick must not end live charts
                logger.exception("telemetry tick failed")
            ticks += 1
            next_at += interval
            delay = next_at - time.monotonic()
            if delay < 0:
                next_at = time.monotonic()  # fell behind: skip ticks, never burst
                delay = 0
            stop.wait(delay)
        try:
            self.flush_rollups()
        finally:
            self.close()
            close_old_connections()


_thread_lock = threading.Lock()
_thread: threading.Thread | None = None
_stop = threading.Event()


def start_relay_thread() -> bool:
    """The embedded default: run the relay as a daemon thread of this process (once)."""
    global _thread
    if not settings.TELEMETRY_RELAY:
        return False
    with _thread_lock:
        if _thread is not None:
            return False
        _stop.clear()
        _thread = threading.Thread(
            target=lambda: Relay().run(_stop), name="telemetry-relay", daemon=True
        )
        _thread.start()
    logger.info("telemetry relay started (%s s interval)", settings.TELEMETRY_INTERVAL)
    return True


__all__ = [
    "ROW_COLUMNS",
    "Relay",
    "TickStats",
    "cluster_group",
    "get_ring",
    "instance_group",
    "start_relay_thread",
]
