"""The provisioning ETA: learnt from recent orders' timelines, counting down between events, the
step under way shown (page and API), the driver's step model only without history."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.cache import cache
from django.utils import timezone
from rest_framework.test import APIClient

from billing import services as billing
from slices import eta, services
from slices.models import Instance, InstanceEvent
from slices.services import eta as eta_service

pytestmark = pytest.mark.django_db


def _timeline(nodes: int, total: float, connect: float) -> eta.Timeline:
    return eta.Timeline(nodes=nodes, at={"ordered": 0.0, "connect": connect, "running": total})


# -- the pure model ---------------------------------------------------------------------------
def test_history_median_beats_the_step_model_and_counts_down() -> None:
    history = [_timeline(16, t, 20.0) for t in (110.0, 112.0, 115.0, 400.0)]
    first = eta.estimate(history, nodes=16, milestone="ordered", since_s=0, fallback_s=100)
    assert (first.source, first.samples, first.seconds) == ("history", 4, 114)  # median, not mean
    later = eta.estimate(history, nodes=16, milestone="ordered", since_s=30, fallback_s=100)
    assert later.seconds == 84
    # From a milestone: what is left after it, less the time since it was reached.
    at_connect = eta.estimate(history, nodes=16, milestone="connect", since_s=4, fallback_s=60)
    assert at_connect.seconds == 114 - 20 - 4
    # Past the estimate it says "any moment" (0), never a negative time.
    assert (
        eta.estimate(history, nodes=16, milestone="ordered", since_s=999, fallback_s=1).seconds == 0
    )


def test_too_little_history_falls_back_and_other_sizes_do_not_count() -> None:
    history = [_timeline(1, 10.0, 2.0)] * 5 + [_timeline(16, 100.0, 20.0)] * 2
    model = eta.estimate(history, nodes=16, milestone="ordered", since_s=0, fallback_s=77)
    assert (model.source, model.seconds) == ("model", 77)
    # 12 nodes compare with 16 (the same power-of-two bucket) once enough of them exist.
    history += [_timeline(16, 100.0, 20.0)]
    assert (
        eta.estimate(history, nodes=12, milestone="ordered", since_s=0, fallback_s=7).seconds == 100
    )
    assert [eta.node_bucket(n) for n in (1, 2, 3, 8, 9, 16)] == [1, 2, 4, 8, 16, 16]


def test_the_milestone_is_the_slowest_nodes_step() -> None:
    assert eta.milestone_of(["mount", "connect", "start"]) == "connect"
    assert eta.milestone_of(["mount", None]) == "ordered"
    assert eta.milestone_of([]) == "ordered"
    assert eta.milestone_of(["reserve", "reserve"]) == "ordered"  # the order's own step
    assert eta_service.current_step(["mount", "connect"]) == "prepare"
    assert eta_service.current_step(["reserve"]) == "isolate"
    assert eta.absolute_error(110, 100) == pytest.approx(0.1)


# -- from the database --------------------------------------------------------------------------
def _order(user, cards: int, name: str, capture, *, execute: bool = True) -> Instance:
    with capture(execute=execute):
        instance, _ = services.order_instance(
            user, services.OrderRequest(gpu_model="A800", cards=cards, name=name)
        )
    instance.refresh_from_db()
    return instance


def _stretch(instance: Instance, seconds: float) -> None:
    """Make a finished order look as if it had taken ``seconds`` from the order to running, its
    node steps (connect to health) the same share of it in every order: the simulated steps'
    real durations vary with the machine's load, and the estimate leaves out orders whose steps
    took another time (``eta.same_regime``)."""
    created = instance.running_at - timedelta(seconds=seconds)
    Instance.objects.filter(pk=instance.pk).update(created_at=created)
    for step, share in (("connect", 0.2), ("health", 0.8)):
        InstanceEvent.objects.filter(instance=instance, code="step_done", step=step).update(
            at=created + timedelta(seconds=seconds * share)
        )


def test_recent_orders_teach_the_first_estimate(
    sim_fleet, alice, django_capture_on_commit_callbacks
) -> None:
    billing.grant_voucher(alice, Decimal("50000"), reason="test", valid_days=30)
    gpu_model_id = _order(alice, 8, "warm", django_capture_on_commit_callbacks).gpu_model_id
    cache.clear()
    model = eta_service.first_estimate("sim", gpu_model_id, 1, slice_=False)
    assert model.source == "model"  # one order of this kind is not yet a history
    for i, took in enumerate((40.0, 42.0, 44.0)):
        done = _order(alice, 8, f"h{i}", django_capture_on_commit_callbacks)
        assert done.state == "running"
        _stretch(done, took)
        # Its step events are part of its timeline, before running.
        assert InstanceEvent.objects.filter(instance=done, code="step_done").exists()
    cache.clear()
    learnt = eta_service.first_estimate("sim", gpu_model_id, 1, slice_=False)
    assert learnt.source == "history" and learnt.samples >= 3
    assert 40 <= learnt.seconds <= 44, learnt

    # A new order not yet picked up by a worker: the page and the API show the learnt estimate,
    # which counts down as the order waits.
    waiting = _order(alice, 8, "waiting", django_capture_on_commit_callbacks, execute=False)
    assert waiting.state in ("pending", "allocating", "provisioning")
    Instance.objects.filter(pk=waiting.pk).update(created_at=timezone.now() - timedelta(seconds=10))
    waiting.refresh_from_db()
    now = eta_service.instance_eta(waiting)
    assert now is not None and now.source == "history"
    assert learnt.seconds - 12 <= now.seconds <= learnt.seconds - 9
    api = APIClient()
    api.force_authenticate(alice)
    row = api.get(f"/api/v1/instances/{waiting.public_id}/").json()
    assert row["eta_seconds"] is not None and row["eta_seconds"] <= learnt.seconds - 9
    assert row["current_step"] in ("", "isolate", "connect")
    running = api.get(f"/api/v1/instances/{done.public_id}/").json()
    assert (running["eta_seconds"], running["current_step"]) == (None, "")


def test_the_page_shows_the_step_under_way_and_a_countdown(
    sim_fleet, alice, alice_client, django_capture_on_commit_callbacks
) -> None:
    billing.grant_voucher(alice, Decimal("50000"), reason="test", valid_days=30)
    waiting = _order(alice, 8, "waiting", django_capture_on_commit_callbacks, execute=False)
    Instance.objects.filter(pk=waiting.pk).update(state="provisioning")
    waiting.nodes.update(step="prepare", step_started_at=timezone.now())
    page = alice_client.get(f"/instances/{waiting.public_id}/", HTTP_ACCEPT_LANGUAGE="en")
    html = page.content.decode()
    assert page.status_code == 200
    assert "Mounting" in html or "mount" in html.lower()
    assert 'id="instance-eta" data-eta-seconds="' in html
    assert 'id="instance-current-step"' in html
    assert "Since the order" in html  # not yet running: the clock is the order's


# -- issue 32: orders from another regime (steps that took another time) do not count ------------
def _steps(nodes: int, total: float, connect: float, health: float) -> eta.Timeline:
    return eta.Timeline(
        nodes=nodes,
        at={"ordered": 0.0, "connect": connect, "health": health, "running": total},
    )


@pytest.mark.parametrize("nodes", [1, 8, 16, 32])
def test_orders_of_another_regime_do_not_count_in_any_size_bucket(nodes: int) -> None:
    """Five older orders whose node steps were instant (0.3 s in all) and three recent ones
    (2.4 s): the estimate is the recent orders' median; counted together it was 0.3 s."""
    recent = [_steps(nodes, t, 0.3, 1.9) for t in (2.40, 2.38, 2.45)]
    old = [_steps(nodes, 0.30, 0.05, 0.15)] * 5
    got = eta.estimate(recent + old, nodes=nodes, milestone="ordered", since_s=0, fallback_s=2.0)
    assert (got.source, got.samples) == ("history", 3)
    assert got.exact == pytest.approx(2.40)
    # Without the regime rule (as before issue 32) the median is an instant order's.
    before = eta.estimate(
        recent + old, nodes=nodes, milestone="ordered", since_s=0, fallback_s=2.0, regime=False
    )
    assert (before.samples, before.exact) == (8, pytest.approx(0.30))


def test_the_regime_is_the_recent_orders_of_every_size() -> None:
    """Recent orders of other sizes set the regime too; a factor of 2 either way still counts;
    an order without its node steps recorded is kept (nothing to compare)."""
    recent_hosts = [_steps(1, 1.9, 0.3, 1.8)] * 5  # node steps 1.5 s
    slices = [
        _steps(16, 3.0, 0.3, 0.3 + 2.9),  # 2.9 s: within 2 × 1.5 s, kept
        _steps(16, 3.2, 0.3, 0.3 + 3.1),  # 3.1 s: more than 2 ×, left out
        _steps(16, 0.8, 0.3, 0.3 + 0.76),  # 0.76 s: within half, kept
        _steps(16, 0.5, 0.3, 0.3 + 0.7),  # 0.7 s: less than half, left out
        _timeline(16, 2.5, 0.3),  # no health milestone: kept
    ]
    kept = eta.same_regime(recent_hosts + slices)
    assert [t.at["running"] for t in kept if t.nodes == 16] == [3.0, 0.8, 2.5]
    assert eta.node_steps(slices[0]) == pytest.approx(2.9)
    assert eta.node_steps(_timeline(16, 2.5, 0.3)) is None
    assert eta.same_regime([]) == []
