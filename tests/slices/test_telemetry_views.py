"""Telemetry over HTTP: an instance's ring as JSON, its minute history as CSV, the cluster's heat
map frame, and /metrics under the DCGM exporter's names (token or staff only)."""

from __future__ import annotations

import csv
import io
import time

import pytest
from django.test import Client
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from slices.models import Instance
from slices.telemetry import relay as relay_module
from slices.telemetry.relay import Relay
from tests.slices.factories import run_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def sampled(sim_fleet, funded, django_capture_on_commit_callbacks) -> Instance:
    """A running 8-card instance, training, with two minutes and a bit of samples in the
    process's ring."""
    instance = run_order(
        funded, django_capture_on_commit_callbacks, platform_env={"SIM_WORKLOAD": "training"}
    )
    relay_module.get_ring.cache_clear()
    relay = Relay(layer=None)  # the process's ring: what the views read
    relay.refresh()
    now = time.time()
    t0 = (now // 60 - 3) * 60  # at least two whole minutes end on the way to now
    for s in range(int(now - t0)):
        relay.tick(t0 + s)
    yield instance
    relay.close()
    relay_module.get_ring.cache_clear()


def test_history_json_has_the_ring_and_since_filters_it(sampled: Instance, alice_client) -> None:
    url = reverse("telemetry:instance-history", args=[sampled.public_id])
    data = alice_client.get(url).json()
    assert data["simulated"] is True and data["hosts"] == [sampled.nodes.get().hostname]
    entries = data["entries"]
    assert len(entries) >= 120 and all(len(e["g"]) == 8 for e in entries)
    last = entries[-1]["ts"]
    newer = alice_client.get(url, {"since": entries[-3]["ts"]}).json()["entries"]
    assert [e["ts"] for e in newer] == [entries[-2]["ts"], last]


def test_history_and_csv_are_404_for_another_customer(sampled: Instance, bob_client) -> None:
    for name in ("telemetry:instance-history", "telemetry:instance-csv"):
        assert bob_client.get(reverse(name, args=[sampled.public_id])).status_code == 404


def test_csv_export_lists_the_minute_rollups(sampled: Instance, alice_client) -> None:
    response = alice_client.get(reverse("telemetry:instance-csv", args=[sampled.public_id]))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert f"{sampled.slug}-gpu-minutes.csv" in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0][:4] == ["minute_utc", "hostname", "gpu", "samples"]
    assert len(rows) - 1 == 8 * sampled.gpu_rollups.values("minute").distinct().count()
    assert len(rows) - 1 >= 16
    assert {r[2] for r in rows[1:]} == {str(i) for i in range(8)}


def test_cluster_frame_is_for_operators_only(
    sampled: Instance, alice_client, operator_client
) -> None:
    code = sampled.nodes.get().node.cluster.code
    url = reverse("telemetry:cluster-latest", args=[code])
    assert alice_client.get(url).status_code == 403
    nodes = operator_client.get(url).json()["nodes"]
    assert list(nodes) == [sampled.nodes.get().hostname]
    assert sorted(g[0] for g in nodes[sampled.nodes.get().hostname]) == list(range(8))


def test_metrics_need_a_token_or_staff(sampled: Instance, alice_client, settings) -> None:
    url = reverse("telemetry:metrics")
    assert Client().get(url).status_code == 401
    assert alice_client.get(url).status_code == 404
    settings.TELEMETRY_METRICS_TOKEN = "s3cret-token"
    assert Client().get(url, HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert Client().get(url, HTTP_AUTHORIZATION="Bearer s3cret-token").status_code == 200


def test_metrics_use_dcgm_names_and_labels(sampled: Instance, operator_client) -> None:
    response = operator_client.get(reverse("telemetry:metrics"))
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.content.decode())}
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert len(util) == 8
    hostname = sampled.nodes.get().hostname
    labels = util[0].labels
    assert labels["Hostname"] == hostname and labels["UUID"].startswith("GPU-")
    assert labels["gpu"] in {str(i) for i in range(8)} and labels["simulated"] == "true"
    assert labels["gpc_instance"] == str(sampled.public_id)
    for name in (
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_XID_ERRORS",
    ):
        assert len(families[name].samples) == 8, name
    fb = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_FB_USED"].samples}
    assert all(20_000 < v < 24_564 for v in fb.values())  # an RTX 4090 in training
    states = {s.labels["state"]: s.value for s in families["gpu_console_instances"].samples}
    assert states["running"] == 1
    assert families["gpu_console_orders"].samples[0].value == 1
    hist = {s.name: s for s in families["gpu_console_provisioning_seconds"].samples}
    assert hist["gpu_console_provisioning_seconds_count"].value == 1
    assert "gpu_console_settlement_lag_seconds" in families
    assert "gpu_console_websocket_clients" in families


def test_instance_page_has_the_live_charts_card(sampled: Instance, alice_client) -> None:
    page = alice_client.get(reverse("slices:instance-detail", args=[sampled.public_id]))
    html = page.content.decode()
    assert 'id="gpu-telemetry"' in html
    assert f'data-ws="/ws/telemetry/instances/{sampled.public_id}/"' in html
    assert reverse("telemetry:instance-csv", args=[sampled.public_id]) in html
    assert "uplot-1.6.32/uPlot.iife.min.js" in html and "slices/telemetry.js" in html
