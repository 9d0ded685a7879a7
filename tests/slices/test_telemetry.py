"""The relay, the ring, the minute rollups, pruning and idle detection, with running instances on the
simulated fleet (SIM_TIME_SCALE=0), the real in-process channel layer and a real Redis server."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core import mail

from slices import services
from slices.choices import InstanceState
from slices.models import GpuRollup, IdleWatch, Instance
from slices.services import telemetry
from slices.telemetry.heat import unpack_nodes
from slices.telemetry.relay import TICK_STAGES, Relay, cluster_group, instance_group
from slices.telemetry.ring import MemoryRing, RedisRing
from slices.telemetry.rollup import MinuteAccumulator, MinuteOfGpu, judge_idle
from slices.telemetry.samples import parse_sample
from slices.telemetry.workload import CHECKPOINT_EVERY, LOST_AFTER, SimWorkload
from tests.slices.factories import run_order
from tests.support.servers import start_redis

pytestmark = pytest.mark.django_db


@pytest.fixture
def order(sim_fleet, funded, django_capture_on_commit_callbacks):
    def make(cards: int = 8, **env: str) -> Instance:
        # SIM_* steer the simulated fleet: the platform's names (slices.envpolicy), not an order's.
        platform = {k: v for k, v in env.items() if k.startswith("SIM_")}
        customer = {k: v for k, v in env.items() if k not in platform}
        instance = run_order(
            funded,
            django_capture_on_commit_callbacks,
            cards=cards,
            env=customer,
            platform_env=platform,
        )
        assert instance.state == InstanceState.RUNNING
        return instance

    return make


def _minute_start() -> float:
    """A whole minute a little ahead of now (the sim workload measures time since its start)."""
    return (time.time() // 60 + 1) * 60


def _run(relay: Relay, start: float, seconds: int) -> None:
    for s in range(seconds):
        relay.tick(start + s)


# ---------------------------------------------------------------------------------------------
# Relay: ring and channel-layer groups
# ---------------------------------------------------------------------------------------------


def test_relay_samples_a_running_instance_into_its_ring_and_groups(order) -> None:
    instance = order(8)
    layer = get_channel_layer()
    inst_ch = async_to_sync(layer.new_channel)()
    cluster = instance.nodes.select_related("node__cluster").get().node.cluster.code
    clus_ch = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(instance_group(instance.public_id), inst_ch)
    async_to_sync(layer.group_add)(cluster_group(cluster), clus_ch)
    ring = MemoryRing()
    relay = Relay(ring, layer=layer)
    relay.refresh()
    assert list(relay.feeds) == [str(instance.public_id)]
    t0 = _minute_start()
    stats = relay.tick(t0)
    assert (stats.instances, stats.gpus, stats.bad_samples) == (1, 8, 0)
    assert set(stats.stages) == set(TICK_STAGES) and all(v >= 0 for v in stats.stages.values())
    assert stats.sent_at > 0  # the channel layer took the live messages

    entries = ring.since(str(instance.public_id))
    assert len(entries) == 1 and entries[0]["sim"] is True
    rows = entries[0]["g"]
    assert sorted(r[1] for r in rows) == list(range(8))
    assert all(r[0] == 0 and 0 <= r[2] <= 100 and r[7] == 0 for r in rows)

    message = async_to_sync(layer.receive)(inst_ch)
    assert message["type"] == "telemetry.sample"
    live = json.loads(message["text"])  # encoded once by the relay for every watcher
    assert live["g"] == rows
    assert len(live["detail"]) == 8
    assert live["detail"][0]["uuid"].startswith("GPU-")
    heat = json.loads(async_to_sync(layer.receive)(clus_ch)["text"])
    hostname = instance.nodes.get().hostname
    assert "nodes" not in heat and heat["hosts"] == [hostname]  # packed (slices.telemetry.heat)
    nodes = unpack_nodes(heat)
    assert [g[0] for g in nodes[hostname]] == sorted(r[1] for r in rows)
    by_gpu = {r[1]: r for r in rows}
    for gpu, util, temp, power, mem in nodes[hostname]:  # the ring's values, as the pages show
        row = by_gpu[gpu]
        assert (util, temp) == (row[2], row[4])
        assert abs(power - row[5]) <= 0.5 and abs(mem - row[3]) <= 8


def test_relay_stops_feeding_a_released_instance_and_drops_its_ring(
    order, django_capture_on_commit_callbacks
) -> None:
    instance = order(2)
    ring = MemoryRing()
    relay = Relay(ring, layer=None)
    relay.refresh()
    relay.tick(_minute_start())
    assert ring.since(str(instance.public_id))
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(instance, by="alice")
    relay.refresh()
    assert relay.feeds == {}
    assert ring.since(str(instance.public_id)) == []
    assert relay.tick().gpus == 0


def test_ring_history_since_returns_only_newer_entries(order) -> None:
    instance = order(2)
    ring = MemoryRing(maxlen=30)
    relay = Relay(ring, layer=None)
    relay.refresh()
    t0 = _minute_start()
    _run(relay, t0, 45)
    history = telemetry.instance_history(instance, ring=ring)
    assert len(history["entries"]) == 30  # bounded: the oldest fell out
    assert history["entries"][0]["ts"] == t0 + 15
    assert history["hosts"] == [instance.nodes.get().hostname]
    assert history["columns"][:3] == ["node", "gpu", "util"]
    newer = telemetry.instance_history(instance, since=t0 + 40, ring=ring)["entries"]
    assert [e["ts"] for e in newer] == [t0 + 41, t0 + 42, t0 + 43, t0 + 44]


def test_memory_ring_is_bounded_per_instance() -> None:
    ring = MemoryRing(maxlen=5)
    for i in range(12):
        ring.append_many({"a": {"ts": float(i), "g": []}, "b": {"ts": float(i), "g": []}})
    assert [e["ts"] for e in ring.since("a")] == [7.0, 8.0, 9.0, 10.0, 11.0]
    assert len(ring) == 10
    assert ring.since("a", 9.0) == [{"ts": 10.0, "g": []}, {"ts": 11.0, "g": []}]
    ring.drop("a")
    assert ring.since("a") == [] and len(ring) == 5


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Redis server of our own on a free loopback port."""
    proc, url = start_redis(tmp_path_factory.mktemp("redis"))
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_redis_ring_is_a_capped_stream_per_instance(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    ring = RedisRing(client, maxlen=10, ttl_seconds=120, approximate=False)
    for i in range(25):
        ring.append_many({"x": {"ts": 1000.0 + i, "g": [[0, 0, i]]}})
    assert client.xlen("telemetry:ring:x") == 10
    assert 0 < client.ttl("telemetry:ring:x") <= 120
    assert [e["ts"] for e in ring.since("x")] == [1015.0 + i for i in range(10)]
    assert [e["ts"] for e in ring.since("x", 1022.0)] == [1023.0, 1024.0]
    # Two samples in the same millisecond (or a clock step back) still both land, in order.
    ring.append_many({"x": {"ts": 1024.0, "g": []}})
    assert ring.since("x")[-1]["ts"] == 1024.0 and client.xlen("telemetry:ring:x") == 10
    ring.publish_latest({"x": {"ts": 1024.0, "gpus": [{"index": 0}]}})
    assert ring.latest() == {"x": {"ts": 1024.0, "gpus": [{"index": 0}]}}
    ring.drop("x")
    assert client.exists("telemetry:ring:x") == 0 and ring.latest() == {}


def test_relay_writes_to_the_redis_ring(order, redis_url: str) -> None:
    import redis

    instance = order(2)
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    relay = Relay(RedisRing(client), layer=None)
    relay.refresh()
    t0 = _minute_start()
    _run(relay, t0, 5)
    history = telemetry.instance_history(instance, since=t0 + 1, ring=relay.ring)
    assert [e["ts"] for e in history["entries"]] == [t0 + 2, t0 + 3, t0 + 4]
    assert len(history["entries"][0]["g"]) == 2


# ---------------------------------------------------------------------------------------------
# Rollups and pruning
# ---------------------------------------------------------------------------------------------


def test_rollups_write_one_row_per_gpu_per_finished_minute(order) -> None:
    instance = order(8)
    relay = Relay(MemoryRing(), layer=None)
    relay.refresh()
    t0 = _minute_start()
    _run(relay, t0, 150)  # two full minutes and half of a third
    rows = GpuRollup.objects.filter(instance=instance)
    assert rows.count() == 16  # 8 GPUs × 2 finished minutes, not 8 × 150 seconds
    first = datetime.fromtimestamp(t0, tz=UTC)
    assert set(rows.values_list("minute", flat=True)) == {first, first + timedelta(minutes=1)}
    for r in rows:
        assert r.samples == 60 and r.simulated
        assert r.util_min <= r.util_mean <= r.util_max <= 100
        assert r.temp_min <= r.temp_mean <= r.temp_max
        assert r.power_min <= r.power_mean <= r.power_max
        assert r.mem_total == pytest.approx(24564.0)
    # The unfinished minute is written when the relay stops.
    assert relay.flush_rollups() == 8
    assert GpuRollup.objects.filter(instance=instance).count() == 24


def test_accumulator_min_mean_max_from_samples() -> None:
    acc = MinuteAccumulator()
    sample = SimWorkload("i", "h", 0, (0,), workload="training").sample
    values = []
    for s in range(60):
        node = parse_sample(sample(600.0 + s))
        values.append(node.gpus[0].util_gpu)
        acc.add("i", "h", node.gpus[0], 600.0 + s, True)
    assert acc.flush(659.0) == []  # the minute has not ended
    (record,) = acc.flush(660.0)
    assert record.samples == 60 and record.minute == 600
    assert record.util == (min(values), round(sum(values) / 60, 2), max(values))
    assert len(acc) == 0


def test_prune_deletes_rollups_past_the_retention(order, settings) -> None:
    settings.TELEMETRY_RETENTION_DAYS = 30
    instance = order(2)
    relay = Relay(MemoryRing(), layer=None)
    relay.refresh()
    _run(relay, _minute_start(), 61)
    assert GpuRollup.objects.count() == 2
    old = GpuRollup.objects.first()
    assert old is not None
    GpuRollup.objects.filter(pk=old.pk).update(minute=old.minute - timedelta(days=31))
    assert telemetry.prune_rollups() == 1
    assert list(GpuRollup.objects.values_list("instance", flat=True)) == [instance.pk]


def test_csv_export_rows_are_the_rollups(order) -> None:
    instance = order(2)
    relay = Relay(MemoryRing(), layer=None)
    relay.refresh()
    _run(relay, _minute_start(), 61)
    rows = list(telemetry.history_csv_rows(instance))
    assert rows[0] == telemetry.CSV_HEADER
    assert len(rows) == 3 and {r[2] for r in rows[1:]} == {0, 1}
    assert rows[1][0].endswith(":00Z") and rows[1][-1] is True


# ---------------------------------------------------------------------------------------------
# The simulated workload
# ---------------------------------------------------------------------------------------------


def test_training_dips_at_checkpoints_idle_stays_near_zero() -> None:
    training = SimWorkload("inst", "h", 0, (0, 1), workload="training", started_at=0)
    utils = [training.gpu(0, float(t))["util_gpu"] for t in range(CHECKPOINT_EVERY)]
    busy = [u for u in utils if u >= 85]
    dips = [u for u in utils if u <= 10]
    assert len(busy) > 0.85 * CHECKPOINT_EVERY and 15 <= len(dips) <= 30
    idle = SimWorkload("inst", "h", 0, (0, 1), workload="idle", started_at=0)
    assert max(idle.gpu(1, float(t))["util_gpu"] for t in range(600)) <= 1
    assert training.sample(5.0)["simulated"] is True


def test_failing_gpu_reports_xids_then_falls_off_the_bus() -> None:
    w = SimWorkload("inst", "h", 0, (0, 1), workload="failing", started_at=0)
    xids = [x for t in range(LOST_AFTER + 1) for x in w.gpu(0, float(t))["xid"]]
    assert 79 in xids and {48, 63} <= set(xids)
    assert all(not w.gpu(1, float(t))["xid"] for t in range(LOST_AFTER + 5))
    lost = parse_sample(w.sample(LOST_AFTER + 2.0))
    assert lost.gpus[0].lost and not lost.gpus[1].lost


def test_relay_counts_xids_of_a_failing_gpu_in_the_rollups(order) -> None:
    instance = order(2, SIM_WORKLOAD="failing")
    relay = Relay(MemoryRing(), layer=None)
    relay.refresh()
    start = relay.feeds[str(instance.public_id)].nodes[0].source.workload.started_at  # type: ignore[attr-defined]
    t0 = (start // 60 + 1) * 60
    _run(relay, t0, 61)
    xids = dict(GpuRollup.objects.filter(instance=instance).values_list("gpu", "xid_events"))
    assert xids[0] >= 1 and xids[1] == 0


# ---------------------------------------------------------------------------------------------
# Idle detection
# ---------------------------------------------------------------------------------------------


def test_judge_idle_needs_every_gpu_below_the_threshold_and_enough_coverage() -> None:
    gpus = [("h", 0), ("h", 1)]

    def rows(peak1: float, minutes: int = 5) -> list[MinuteOfGpu]:
        return [
            MinuteOfGpu("h", g, 600 + 60 * m, peak1 if g == 1 else 0.0, 0.0, 1024.0)
            for m in range(minutes)
            for g in (0, 1)
        ]

    idle = judge_idle(rows(2.0), gpus=gpus, now=900.0, threshold=5, window_minutes=5)
    assert idle.idle and idle.since == 600
    assert idle.evidence["peak"] == 2.0 and idle.evidence["peak_gpu"] == "h/1"
    assert idle.evidence["mem_held_mib"] == 2048.0
    busy = judge_idle(rows(40.0), gpus=gpus, now=900.0, threshold=5, window_minutes=5)
    assert not busy.idle  # one GPU's one busy minute keeps the instance busy
    sparse = judge_idle(rows(0.0, 2), gpus=gpus, now=900.0, threshold=5, window_minutes=5)
    assert not sparse.idle  # 2 of 5 minutes sampled: not enough to judge
    missing = judge_idle(
        rows(0.0), gpus=[*gpus, ("h", 2)], now=900.0, threshold=5, window_minutes=5
    )
    assert not missing.idle  # a GPU with no samples is not known to be idle


def _idle_for(instance: Instance, settings, minutes: int = 3) -> datetime:
    settings.TELEMETRY_IDLE_MINUTES = minutes
    relay = Relay(MemoryRing(), layer=None)
    relay.refresh()
    t0 = _minute_start()
    _run(relay, t0, (minutes + 1) * 60 + 1)
    return datetime.fromtimestamp(t0 + (minutes + 1) * 60 + 1, tz=UTC)


def test_idle_instance_warns_the_owner_once_with_the_reason(
    order, settings, django_capture_on_commit_callbacks
) -> None:
    instance = order(2, SIM_WORKLOAD="idle")
    now = _idle_for(instance, settings)
    with django_capture_on_commit_callbacks(execute=True):
        decision = telemetry.check_idle(instance, now)
    assert decision.verdict.idle and decision.warned and not decision.released
    watch = IdleWatch.objects.get(instance=instance)
    assert watch.warned_at == now and watch.evidence["window_minutes"] == 3
    assert watch.evidence["peak"] <= 1 and watch.evidence["gpus"] == 2
    event = instance.events.get(code="idle_warning")
    assert event.level == "warning" and event.params["release"] is False
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["alice@example.com"]
    assert "3" in mail.outbox[0].body
    with django_capture_on_commit_callbacks(execute=True):
        again = telemetry.check_idle(instance, now + timedelta(seconds=30))
    assert again.verdict.idle and not again.warned  # once per idle spell
    assert len(mail.outbox) == 1
    instance.refresh_from_db()
    assert instance.state == InstanceState.RUNNING


def test_idle_instance_is_released_when_chosen_at_order_time(
    order, settings, django_capture_on_commit_callbacks
) -> None:
    instance = order(2, SIM_WORKLOAD="idle", GPC_RELEASE_WHEN_IDLE="1")
    now = _idle_for(instance, settings)
    with django_capture_on_commit_callbacks(execute=True):
        (decision,) = telemetry.check_idle_instances(now)
    assert decision.released
    instance.refresh_from_db()
    assert instance.state == InstanceState.RELEASED
    codes = list(instance.events.values_list("code", flat=True))
    assert codes.index("idle_warning") < codes.index("idle_release")


def test_training_instance_is_not_idle(order, settings, django_capture_on_commit_callbacks) -> None:
    # A job runs on it (a host only started reads idle since issue 29).
    instance = order(2, SIM_WORKLOAD="training", GPC_RELEASE_WHEN_IDLE="1")
    now = _idle_for(instance, settings)
    with django_capture_on_commit_callbacks(execute=True):
        decision = telemetry.check_idle(instance, now)
    assert not decision.verdict.idle and not decision.warned
    assert decision.verdict.evidence["peak"] >= 85
    instance.refresh_from_db()
    assert instance.state == InstanceState.RUNNING
    assert len(mail.outbox) == 0


def test_beat_runs_the_idle_check_and_the_pruning(order, settings) -> None:
    from slices.tasks import check_idle_instances_task, prune_telemetry_task

    scheduled = {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {check_idle_instances_task.name, prune_telemetry_task.name} <= scheduled
    order(2)
    assert check_idle_instances_task.delay().get() == "0 idle of 1"
    assert prune_telemetry_task.delay().get() == "0 rollups pruned"


@pytest.mark.parametrize("since", [math.nan, math.inf, -math.inf, 1e300, -5.0, 2.0**53])
def test_the_redis_ring_takes_any_since_without_an_error(redis_url: str, since: float) -> None:
    """``?since=`` is the browser's number: one Redis refused as a stream ID was a 500."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    ring = RedisRing(client, maxlen=10, ttl_seconds=120, approximate=False)
    ring.append_many({"x": {"ts": 1000.0, "g": []}})
    entries = ring.since("x", since)
    expected = [] if since > 1000 else [{"ts": 1000.0, "g": []}]
    assert entries == expected
