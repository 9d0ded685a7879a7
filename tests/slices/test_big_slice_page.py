"""A multi-node instance's page: provisioning grouped by step (how many nodes passed each, the
slowest node named, a failed one in red, the per-node rows folded, fetched when opened beyond 32
nodes) and its step events folded per step in the Events tab; a one-node instance as before."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from billing import services as billing
from slices import services
from slices.models import Instance, InstanceNode
from slices.services.instances import record_event
from tests.slices.factories import SMALL_FLEET, load_small_fleet

pytestmark = pytest.mark.django_db


def _order(user, gpu_model: str, cards: int, capture) -> Instance:  # noqa: ANN001
    """An order left where the worker would pick it up (nodes reserved, no step run yet)."""
    billing.grant_voucher(user, Decimal("50000"), reason="test", valid_days=30)
    with capture(execute=False):
        instance, _ = services.order_instance(
            user, services.OrderRequest(gpu_model=gpu_model, cards=cards, name="big")
        )
    instance.refresh_from_db()
    return instance


def _page(client: Client, instance: Instance, lang: str = "en", **query: str) -> str:
    r = client.get(f"/instances/{instance.public_id}/", query, HTTP_ACCEPT_LANGUAGE=lang)
    assert r.status_code == 200
    return r.content.decode()


def _step_row(html: str, step: str) -> dict[str, str]:
    m = re.search(rf'<li [^>]*data-step="{step}"[^>]*>', html)
    assert m, f"no row for {step}"
    return dict(re.findall(r'data-(done|total|status)="([^"]*)"', m.group(0)))


@pytest.fixture
def a800_fleet(sim_driver) -> None:
    """The small fleet with 24 A800 nodes (three SUs of 8) to take a 128-card slice."""
    assert SMALL_FLEET.count("scalable_units: [8]\n") == 1
    load_small_fleet(SMALL_FLEET.replace("scalable_units: [8]\n", "scalable_units: [8, 8, 8]\n"))


@pytest.fixture
def provisioning_slice(a800_fleet, alice, django_capture_on_commit_callbacks) -> Instance:
    """128 × A800 (16 nodes) part-way: 12 nodes mounting done, 3 still preparing (#13 the one
    on it longest), #15 failed on "prepare" after "connect"."""
    instance = _order(alice, "A800", 128, django_capture_on_commit_callbacks)
    Instance.objects.filter(pk=instance.pk).update(state="provisioning")
    now = timezone.now()
    nodes = list(instance.nodes.order_by("rank"))
    assert len(nodes) == 16
    for n in nodes[:12]:
        InstanceNode.objects.filter(pk=n.pk).update(step="mount", step_started_at=now)
    for n, ago in zip(nodes[12:15], (5, 30, 10), strict=True):
        InstanceNode.objects.filter(pk=n.pk).update(
            step="prepare", step_started_at=now - timedelta(seconds=ago)
        )
    InstanceNode.objects.filter(pk=nodes[15].pk).update(
        step="connect", failed=True, message="simulated failure"
    )
    instance.refresh_from_db()
    return instance


def test_provisioning_is_grouped_by_step_with_the_slowest_and_failed_nodes(
    provisioning_slice: Instance, alice_client: Client
) -> None:
    html = _page(alice_client, provisioning_slice)
    assert _step_row(html, "reserve") == {"done": "16", "total": "16", "status": "done"}
    assert _step_row(html, "isolate") == {"done": "16", "total": "16", "status": "done"}
    assert _step_row(html, "connect") == {"done": "16", "total": "16", "status": "done"}
    # 15 passed "prepare"; the failed node was on it.
    assert _step_row(html, "prepare") == {"done": "15", "total": "16", "status": "failed"}
    assert _step_row(html, "mount") == {"done": "12", "total": "16", "status": "running"}
    assert "3 under way" in html
    assert _step_row(html, "start") == {"done": "0", "total": "16", "status": "running"}
    assert _step_row(html, "health") == {"done": "0", "total": "16", "status": "waiting"}
    # The node furthest behind: on "prepare", the longest (30 s) of the three.
    slowest = re.search(r'<div[^>]*id="instance-slowest"[^>]*>(.*?)</div>', html, re.S)
    assert slowest and 'data-rank="13"' in slowest.group(0)
    assert "Mount storage and assets…" in slowest.group(1)
    failed = re.search(
        r'<div class="small text-danger mb-1" data-failed-node="15">(.*?)</div>', html
    )
    assert failed and "Prepare directory and user" in failed.group(1)
    assert "simulated failure" in failed.group(1)
    # Each node's row: folded (closed), but with the page at 16 nodes.
    assert re.search(r'<details class="small" id="instance-nodes" data-fold="nodes">', html)
    assert html.count('<div class="col"><div class="d-flex justify-content-between">') == 16
    # In Chinese, the step names of the rows.
    zh = _page(alice_client, provisioning_slice, "zh-hans")
    assert "网络隔离" in zh and "16/16" in zh


def test_beyond_32_nodes_the_rows_come_only_when_opened(
    provisioning_slice: Instance, alice_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slices.views import instances as views

    monkeypatch.setattr(views, "NODES_INLINE_MAX", 8)  # 16 nodes stand in for 128
    html = _page(alice_client, provisioning_slice)
    assert 'id="instance-nodes" data-fold="nodes" data-lazy="1"' in html
    assert 'id="instance-node-list"' not in html
    assert 'href="?nodes=1#instance-nodes"' in html  # without JavaScript: a link
    opened = alice_client.get(
        f"/instances/{provisioning_slice.public_id}/", {"nodes": "1"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert opened.lstrip().startswith('<div id="instance-live"')
    assert 'id="instance-nodes" data-fold="nodes" open>' in opened
    assert opened.count('<div class="col"><div class="d-flex justify-content-between">') == 16


def test_a_running_slice_says_how_many_nodes_are_ready(
    provisioning_slice: Instance, alice_client: Client
) -> None:
    Instance.objects.filter(pk=provisioning_slice.pk).update(state="running")
    provisioning_slice.nodes.update(step="ready", failed=False)
    html = _page(alice_client, provisioning_slice)
    assert 'id="instance-nodes-ready" data-ready="16" data-total="16"' in html
    assert "16 of 16 nodes ready" in html
    assert 'id="instance-steps"' not in html and 'id="instance-slowest"' not in html


def test_step_events_are_folded_per_step_and_per_round(
    provisioning_slice: Instance, alice_client: Client
) -> None:
    instance = provisioning_slice
    hosts = list(instance.nodes.order_by("rank").values_list("hostname", flat=True))
    for step in ("isolate", "connect"):
        for host in hosts:
            record_event(instance, "step", code="step_done", step=step, node=host,
                         params={"step": step})  # fmt: skip
    record_event(instance, "step", code="step_retry", step="prepare", node=hosts[3], level="warning",
                 params={"step": "prepare", "error": "timeout", "delay": 1, "attempt": 2})  # fmt: skip
    # A second round on one node (its replacement after a migration): a group of its own.
    record_event(instance, "step", code="step_done", step="isolate", node=hosts[0],
                 params={"step": "isolate"})  # fmt: skip
    html = alice_client.get(
        f"/instances/{instance.public_id}/",
        {"part": "events"},
        HTTP_HX_REQUEST="true",
        HTTP_ACCEPT_LANGUAGE="en",
    ).content.decode()
    assert html.lstrip().startswith('<ol class="list-unstyled small mb-0" id="instance-events">')
    groups = re.findall(r'data-step-group="(\w+)" data-done="(\d+)" data-total="(\d+)"', html)
    assert groups == [("isolate", "16", "16"), ("connect", "16", "16"), ("isolate", "1", "16")]
    assert "Isolate on the fabric done on 16 of 16 nodes" in html
    assert f"last: {hosts[-1]}" in html
    # Folded: no line per node and step; the retry (a warning) stays a line of its own.
    assert "Isolate on the fabric done." not in html
    assert html.count('<li class="event-warning"') == 1
    # Each fold is keyed by its first event, so the page can keep it open while it grows.
    keys = re.findall(r'<details data-fold="events-(\d+)">', html)
    assert len(keys) == 3 and keys == sorted(keys, key=int)


def test_a_one_node_instance_keeps_its_lines(
    sim_fleet, alice, alice_client: Client, django_capture_on_commit_callbacks
) -> None:
    instance = _order(alice, "RTX4090", 8, django_capture_on_commit_callbacks)
    assert instance.nodes.count() == 1
    record_event(instance, "step", code="step_done", step="isolate", node="h",
                 params={"step": "isolate"})  # fmt: skip
    html = _page(alice_client, instance)
    assert "Isolate on the fabric done." in html
    assert "data-step-group" not in html
    assert 'id="instance-steps"' not in html and 'id="instance-nodes"' not in html
    assert 'id="instance-node-list"' in html
