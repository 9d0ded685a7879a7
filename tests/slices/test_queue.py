"""排队 (issue 32): queued orders hold nothing, start when capacity frees, are told, and leave
the queue with a notice when their funds fail at the start."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone, translation

from billing import services as billing
from billing.models import UsageSession
from console.notices.models import Notice
from slices import services
from slices.choices import InstanceState
from slices.errors import OrderRefused, QuotaExceeded
from slices.models import Instance
from slices.services import queue
from slices.services.allocation import NoCapacity
from tests.slices.factories import run_order

pytestmark = pytest.mark.django_db


def _fill(user, capture):
    """Both RTX4090 nodes of the small fleet taken by 8-card hosts."""
    return [run_order(user, capture, name=f"fill{i}") for i in range(2)]


def _queue_one(user, capture, **kw):
    req = services.OrderRequest(
        gpu_model="RTX4090", cards=8, name="waiting", when_unavailable="queue", **kw
    )
    with capture(execute=True):
        instance, created = services.order_instance(user, req)
    instance.refresh_from_db()
    return instance


def test_full_fleet_queues_instead_of_refusing(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    _fill(funded, django_capture_on_commit_callbacks)
    with pytest.raises(NoCapacity):  # without "queue": refused as always
        run_order(funded, django_capture_on_commit_callbacks)
    q = _queue_one(funded, django_capture_on_commit_callbacks)
    assert q.state == InstanceState.QUEUED
    assert q.allocation_id is None and not q.nodes.exists()
    assert not UsageSession.objects.filter(resource_id=str(q.public_id)).exists()
    assert q.queue_deadline is not None and q.queued_at is not None
    assert q.start_estimate["position"] == 1  # estimated by the admission the order queued
    assert q.start_estimate["p50"] and q.start_estimate["p90"] >= q.start_estimate["p50"]


def test_release_starts_the_queued_order_and_tells_once(
    sim_fleet, funded, django_capture_on_commit_callbacks
):
    first, _second = _fill(funded, django_capture_on_commit_callbacks)
    q = _queue_one(funded, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(first, by="alice")
    q.refresh_from_db()
    assert q.state == InstanceState.RUNNING, list(q.events.values_list("code", flat=True))
    assert q.start_estimate == {} or q.state != InstanceState.QUEUED
    assert Notice.objects.filter(recipient=funded, event="queued_started").count() == 1
    # Admission again (a redelivered task) changes nothing and tells nobody twice.
    with django_capture_on_commit_callbacks(execute=True):
        queue.admit("RTX4090")
    assert Notice.objects.filter(recipient=funded, event="queued_started").count() == 1
    q.refresh_from_db()
    assert q.state == InstanceState.RUNNING


def test_cancel_is_free(sim_fleet, funded, django_capture_on_commit_callbacks):
    _fill(funded, django_capture_on_commit_callbacks)
    q = _queue_one(funded, django_capture_on_commit_callbacks)
    balance = billing.balance_of(funded) if hasattr(billing, "balance_of") else None
    with django_capture_on_commit_callbacks(execute=True):
        assert services.release_instance(q, by="alice")
    q.refresh_from_db()
    assert q.state == InstanceState.RELEASED
    assert q.events.filter(code="queue_cancelled").exists()
    assert not UsageSession.objects.filter(resource_id=str(q.public_id)).exists()
    if balance is not None:
        assert billing.balance_of(funded) == balance


def test_bound_per_team(sim_fleet, funded, settings, django_capture_on_commit_callbacks):
    settings.SLICES_QUEUE_MAX_PER_TEAM = 2
    _fill(funded, django_capture_on_commit_callbacks)
    _queue_one(funded, django_capture_on_commit_callbacks)
    _queue_one(funded, django_capture_on_commit_callbacks)
    with pytest.raises(QuotaExceeded):
        _queue_one(funded, django_capture_on_commit_callbacks)
    assert Instance.objects.filter(state=InstanceState.QUEUED).count() == 2


def test_funds_failing_at_start_skip_with_notice(
    sim_fleet, funded, bob, django_capture_on_commit_callbacks
):
    first, _second = _fill(funded, django_capture_on_commit_callbacks)
    billing.grant_voucher(bob, Decimal("100"), reason="test", valid_days=1)
    q = _queue_one(bob, django_capture_on_commit_callbacks)
    assert q.state == InstanceState.QUEUED
    # Bob's credit is gone by the time the GPUs free (his voucher expired; Alice's has not).
    assert billing.expire_vouchers(timezone.now() + timedelta(days=2)) == 1
    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(first, by="alice")
    q.refresh_from_db()
    assert q.state == InstanceState.RELEASED
    assert q.failure_code == "queue_funds"
    assert q.allocation_id is None
    notice = Notice.objects.get(recipient=bob, event="queued_skipped")
    assert notice.params["name"] == "waiting"


def test_max_wait_past_leaves_the_queue(sim_fleet, funded, django_capture_on_commit_callbacks):
    _fill(funded, django_capture_on_commit_callbacks)
    q = _queue_one(funded, django_capture_on_commit_callbacks, max_wait_hours=1)
    Instance.objects.filter(pk=q.pk).update(queue_deadline=q.queued_at - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        queue.admit("RTX4090")
    q.refresh_from_db()
    assert q.state == InstanceState.RELEASED and q.failure_code == "queue_expired"


def test_bad_queue_fields_are_refused(sim_fleet, funded):
    with pytest.raises(OrderRefused) as exc:
        services.order_instance(
            funded,
            services.OrderRequest(gpu_model="RTX4090", cards=8, when_unavailable="later"),
        )
    assert exc.value.field == "when_unavailable"
    with pytest.raises(OrderRefused) as exc:
        services.order_instance(
            funded,
            services.OrderRequest(
                gpu_model="RTX4090", cards=8, when_unavailable="queue", max_wait_hours=10_000
            ),
        )
    assert exc.value.field == "max_wait_hours"
    assert not Instance.objects.exists()


def test_page_says_what_the_range_means(
    sim_fleet, funded, client, django_capture_on_commit_callbacks
):
    _fill(funded, django_capture_on_commit_callbacks)
    q = _queue_one(funded, django_capture_on_commit_callbacks)
    client.force_login(funded)
    with translation.override("en"):
        page = client.get(f"/instances/{q.public_id}/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "Queued" in page and "9 in 10" in page
    client.cookies.load({"django_language": "zh-hans"})
    page = client.get(f"/instances/{q.public_id}/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "排队" in page and "10 次中有 9 次" in page


def test_api_queue_and_start_estimate(sim_fleet, funded, django_capture_on_commit_callbacks):
    from rest_framework.test import APIClient

    _fill(funded, django_capture_on_commit_callbacks)
    api = APIClient()
    api.force_authenticate(funded)
    with django_capture_on_commit_callbacks(execute=True):
        r = api.post(
            "/api/v1/instances/",
            {"gpu_model": "RTX4090", "cards": 8, "when_unavailable": "queue"},
            format="json",
        )
    assert r.status_code == 202, r.content
    body = r.json()
    assert body["state"] == "queued"
    r = api.get(f"/api/v1/instances/{body['id']}/")
    est = r.json()["start_estimate"]
    assert set(est) >= {"p50", "p90", "position", "updated_at"} and est["position"] == 1
    r = api.post(
        "/api/v1/instances/",
        {"gpu_model": "RTX4090", "cards": 8, "when_unavailable": "soon"},
        format="json",
    )
    assert r.status_code == 400 and "when_unavailable" in r.content.decode()


def test_other_team_cannot_see_or_cancel_a_queued_order(
    sim_fleet, funded, bob, client, django_capture_on_commit_callbacks
):
    _fill(funded, django_capture_on_commit_callbacks)
    q = _queue_one(funded, django_capture_on_commit_callbacks)
    client.force_login(bob)
    assert client.get(f"/instances/{q.public_id}/").status_code == 404
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(bob)
    assert api.get(f"/api/v1/instances/{q.public_id}/").status_code == 404
    assert api.post(f"/api/v1/instances/{q.public_id}/release/").status_code == 404
    q.refresh_from_db()
    assert q.state == InstanceState.QUEUED


def test_order_form_can_queue(sim_fleet, funded, client, django_capture_on_commit_callbacks):
    _fill(funded, django_capture_on_commit_callbacks)
    client.force_login(funded)
    url = "/instances/new/?gpu_model=RTX4090&cards=8"
    page = client.get(url, HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert 'name="when_unavailable"' in page and 'id="order-queue-note"' in page
    with django_capture_on_commit_callbacks(execute=True):
        r = client.post(
            url,
            {
                "gpu_model": "RTX4090",
                "cards": "8",
                "billing_mode": "on_demand",
                "when_unavailable": "queue",
                "queue_max_wait_hours": "6",
            },
        )
    assert r.status_code == 302, r.content.decode()[-2000:]
    q = Instance.objects.get(state=InstanceState.QUEUED)
    assert round((q.queue_deadline - q.queued_at).total_seconds()) == 6 * 3600


def test_duration_model_measures_open_ended_rentals_only(funded):
    """The remaining time of a rental without a known end is drawn from rentals without one: an
    automatically released rental's length (its chosen end) is not measured, ended or running."""
    from tests.slices.factories import make_instance

    now = timezone.now()
    for k in range(25):
        make_instance(
            funded, name=f"open{k}", state="released",
            running_at=now - timedelta(hours=2), ended_at=now - timedelta(hours=1),
        )  # fmt: skip
        make_instance(
            funded, name=f"auto{k}", state="released",
            running_at=now - timedelta(hours=30), ended_at=now - timedelta(hours=5),
            auto_release_at=now - timedelta(hours=5),
        )  # fmt: skip
    make_instance(funded, name="auto-running", running_at=now - timedelta(days=3),
                  auto_release_at=now + timedelta(hours=1))  # fmt: skip
    model = queue.duration_model()
    assert not model.prior and len(model.hosts) == 25
    assert model.hosts.durations == [3600.0] * 25  # the open-ended hour, not the 25 h ones
    assert model.hosts.longest == 3600.0  # the running auto-released one is not censored data
