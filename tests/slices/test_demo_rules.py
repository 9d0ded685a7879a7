"""The demo's rules on money: one live demo run per account at a time (whatever the launch key),
and a GPU model the demo does not offer is refused, never silently replaced."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import translation

from billing import services as billing
from billing.seed import seed_default_prices
from marketplace import recipes as catalogue_recipes
from slices.choices import InstanceState
from slices.errors import OrderRefused
from slices.models import Instance, Node
from slices.services import recipes
from slices.services.instances import release_instance
from tests.slices.factories import load_small_fleet

pytestmark = pytest.mark.django_db
URL = "/demo/llama-7b/"


@pytest.fixture
def world(full_catalogue, settings) -> None:  # noqa: ANN001
    settings.SIM_TIME_SCALE = 0
    settings.RECIPE_FOLLOW_INTERVAL = 0.01
    seed_default_prices()
    load_small_fleet()


@pytest.fixture
def newcomer(alice):  # noqa: ANN001, ANN201
    assert billing.grant_trial_credit(alice)
    return alice


def recipe() -> catalogue_recipes.Recipe:
    found = catalogue_recipes.get_demo("llama-7b")
    assert found is not None
    return found


def _held_launch(user, **kwargs):  # noqa: ANN001, ANN003, ANN202
    """Launch with nothing run behind it (no provisioning, no follower): the run stays live, as
    it does for its half hour in real life."""
    from console.celery import app

    app.conf.task_always_eager = False
    try:
        return recipes.launch_recipe(user, recipe(), accept_license=True, **kwargs)
    finally:
        app.conf.task_always_eager = True


def test_a_second_launch_with_a_fresh_key_is_refused_while_the_first_run_is_live(
    world, newcomer
) -> None:  # noqa: ANN001
    first = _held_launch(newcomer, idempotency_key="demo:one")
    assert first.state == InstanceState.PROVISIONING
    # The same key is the same click: the same run.
    assert _held_launch(newcomer, idempotency_key="demo:one").pk == first.pk
    for key in ("demo:two", None):
        with pytest.raises(recipes.DemoRunLive) as refused:
            _held_launch(newcomer, idempotency_key=key)
        assert refused.value.http_status == 409 and refused.value.code == "conflict"
        assert refused.value.live.pk == first.pk
        assert refused.value.as_body()["instance"] == str(first.public_id)
        with translation.override("en"):
            assert "one demo run at a time" in refused.value.message()
    assert Instance.objects.filter(created_by=newcomer).count() == 1

    # Released: the next run may start.
    assert release_instance(first, by="alice")
    first.refresh_from_db()
    assert first.state in (InstanceState.RELEASING, InstanceState.RELEASED)
    second = _held_launch(newcomer, idempotency_key="demo:three")
    assert second.pk != first.pk


def test_another_accounts_run_does_not_count(world, newcomer, bob) -> None:  # noqa: ANN001
    assert billing.grant_trial_credit(bob)
    _held_launch(newcomer)
    assert _held_launch(bob).created_by == bob


def test_the_page_opens_the_live_run_instead_of_launching_a_second(
    world, newcomer, client: Client
) -> None:  # noqa: ANN001
    client.force_login(newcomer)
    live = _held_launch(newcomer, idempotency_key="demo:first")
    html = client.get(URL).content.decode()
    key = re.search(r'name="launch_key" value="([0-9a-f-]{36})"', html).group(1)
    response = client.post(URL, {"accept_license": "on", "launch_key": key}, follow=True)
    assert response.redirect_chain[0] == (
        reverse("slices:instance-detail", args=[live.public_id]),
        302,
    )
    assert "同一时间只能有一个演示运行" in response.content.decode()  # the page speaks Chinese
    assert Instance.objects.filter(created_by=newcomer).count() == 1


def test_a_gpu_model_the_demo_does_not_offer_is_refused_not_replaced(world, newcomer) -> None:  # noqa: ANN001
    # The RTX 4090s are free: the demo offers them, and only them.
    for posted in ("H800", "A800", "GTX 1080"):
        with pytest.raises(OrderRefused) as refused:
            recipes.launch_recipe(newcomer, recipe(), accept_license=True, gpu_model=posted)
        with translation.override("en"):
            message = refused.value.message()
        assert posted in message and "RTX 4090" in message and "offers" in message, message
    assert not Instance.objects.exists()
    # As people write it or as the fleet codes it: the offered model runs.
    instance = _held_launch(newcomer, gpu_model="RTX 4090")
    assert instance.gpu_model.code == "RTX4090"


def test_a_busy_preferred_model_is_refused_when_named_and_the_substitute_is_named(
    world, newcomer
) -> None:  # noqa: ANN001
    Node.objects.filter(cluster__code="xm-4090").update(free_mask=0)
    with pytest.raises(OrderRefused) as refused:
        recipes.launch_recipe(newcomer, recipe(), accept_license=True, gpu_model="RTX4090")
    with translation.override("en"):
        assert "it offers A800" in refused.value.message()
    assert not Instance.objects.exists()
    assert _held_launch(newcomer, gpu_model="A800").gpu_model.code == "A800"


def test_the_page_says_why_a_posted_model_is_refused(world, newcomer, client: Client) -> None:  # noqa: ANN001
    client.force_login(newcomer)
    response = client.post(URL, {"accept_license": "on", "gpu_model": "H800"})
    assert response.status_code == 409
    html = response.content.decode()
    assert 'id="demo-error"' in html and "H800" in html
    assert not Instance.objects.exists()
