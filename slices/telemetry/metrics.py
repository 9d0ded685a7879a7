"""``/metrics`` for Prometheus: the fleet's GPUs under the DCGM exporter's metric names and labels
(so existing Grafana dashboards work unchanged), plus the console's own figures.

Built per scrape from what the relay last published (the ring's "latest" snapshot, shared through
Redis in production) and from the database; nothing is kept in this process except the
websocket-client counter, which lives in the cache (shared by every web server in production).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.core.cache import cache
from django.db.models import Count
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from billing import services as billing
from slices.choices import InstanceState
from slices.models import Instance

# DCGM exporter name → (help, the agent field it comes from).
DCGM_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "util"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "util_mem"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "mem_used"),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "fb_free"),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temp"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power"),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", "power_limit"),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock"),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "mem_clock"),
    ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "PCIe TX throughput (in KB/s).", "pcie_tx"),
    ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "PCIe RX throughput (in KB/s).", "pcie_rx"),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total single-bit volatile ECC errors.", "ecc_corrected"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total double-bit volatile ECC errors.", "ecc_uncorrected"),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "last_xid"),
)
DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "gpc_instance", "simulated")
PROVISIONING_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)
WS_CLIENTS_KEY = "telemetry:ws-clients:{stream}"


def websocket_client_changed(stream: str, delta: int) -> None:
    """Count open telemetry websockets per stream kind (instance / cluster)."""
    key = WS_CLIENTS_KEY.format(stream=stream)
    try:
        if delta > 0:
            cache.add(key, 0, timeout=None)
            cache.incr(key, delta)
        else:
            cache.decr(key, -delta)
    except ValueError:  # the key expired or was evicted: start again from here
        cache.set(key, max(0, delta), timeout=None)


class ConsoleCollector(Collector):
    def __init__(self, gpus: list[dict[str, Any]]) -> None:
        self.gpus = gpus

    def collect(self) -> Iterator[Metric]:
        yield from self._dcgm()
        yield from self._console()

    def _dcgm(self) -> Iterator[Metric]:
        families = {
            name: GaugeMetricFamily(name, help_text, labels=DCGM_LABELS)
            for name, help_text, _ in DCGM_FIELDS
        }
        for g in self.gpus:
            if g.get("state") == "lost":
                continue
            labels = [
                str(g.get("index", "")),
                str(g.get("uuid", "")),
                f"nvidia{g.get('index', '')}",
                str(g.get("name", "")),
                str(g.get("host", "")),
                str(g.get("instance", "")),
                "true" if g.get("simulated") else "false",
            ]
            values = dict(g)
            if g.get("mem_total") is not None and g.get("mem_used") is not None:
                values["fb_free"] = max(0.0, g["mem_total"] - g["mem_used"])
            for name, _help, field in DCGM_FIELDS:
                value = values.get(field)
                if value is not None:
                    families[name].add_metric(labels, float(value))
        yield from families.values()

    def _console(self) -> Iterator[Metric]:
        by_state = dict(
            Instance.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n")
        )
        states = GaugeMetricFamily("gpu_console_instances", "Instances by state.", labels=["state"])
        for state in InstanceState.values:
            states.add_metric([state], by_state.get(state, 0))
        yield states
        yield CounterMetricFamily(
            "gpu_console_orders", "Instances ordered since the start.", value=sum(by_state.values())
        )
        gpus_running = GaugeMetricFamily(
            "gpu_console_gpus_sampled", "GPUs whose samples reached the relay in the last 30 s."
        )
        gpus_running.add_metric([], len(self.gpus))
        yield gpus_running
        # Order → running, for instances that got there in the last day (from the database).
        since = timezone.now() - timedelta(days=1)
        durations = [
            (running - created).total_seconds()
            for created, running in Instance.objects.filter(running_at__gte=since).values_list(
                "created_at", "running_at"
            )
            if running is not None
        ]
        buckets = [(str(b), sum(1 for d in durations if d <= b)) for b in PROVISIONING_BUCKETS] + [
            ("+Inf", len(durations))
        ]
        yield HistogramMetricFamily(
            "gpu_console_provisioning_seconds",
            "Order to running, instances that reached running in the last 24 h.",
            buckets=buckets,
            sum_value=sum(durations),
        )
        # A session never settled yet counts from its start.
        oldest = billing.oldest_unsettled_at()
        settlement = GaugeMetricFamily(
            "gpu_console_settlement_lag_seconds",
            "Seconds since the least recently settled open usage session was settled.",
        )
        settlement.add_metric(
            [], (timezone.now() - oldest).total_seconds() if oldest is not None else 0.0
        )
        yield settlement
        clients = GaugeMetricFamily(
            "gpu_console_websocket_clients", "Open telemetry websockets.", labels=["stream"]
        )
        for stream in ("instance", "cluster"):
            clients.add_metric([stream], cache.get(WS_CLIENTS_KEY.format(stream=stream)) or 0)
        yield clients


def render_metrics(gpus: list[dict[str, Any]]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ConsoleCollector(gpus))
    return generate_latest(registry)
