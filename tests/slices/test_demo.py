"""The one-click LLaMA-7B demo on the simulated fleet: its offer priced on the price book, the
licence accepted on the page, the launch, the simulated run's progress, the automatic release and
what it cost, paid from the trial credit."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing import services as billing
from billing.seed import seed_default_prices
from marketplace import recipes as catalogue_recipes
from marketplace.services import get_asset_by_hub_id, has_accepted_license
from slices import progress
from slices.choices import InstanceState
from slices.drivers.sim import sim_recipe_lines
from slices.errors import OrderRefused
from slices.models import Instance, InstanceEvent, Node
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
    """A verified new account: the 10.00 元 trial credit and nothing else."""
    assert billing.grant_trial_credit(alice)
    return alice


def recipe() -> catalogue_recipes.Recipe:
    found = catalogue_recipes.get_demo("llama-7b")
    assert found is not None
    return found


def test_the_offer_is_priced_on_the_price_book_and_stays_below_the_trial_credit(
    world, newcomer
) -> None:  # noqa: ANN001
    offer = recipes.demo_offer(newcomer, recipe())
    assert offer.choice is not None and offer.choice.gpu_model == "RTX4090"
    assert offer.choice.per_hour == Decimal("15.20")  # 8 × 1.90 元/card-hour from the book
    assert offer.choice.time_limit_s == 30 * 60
    assert offer.choice.max_cost == Decimal("7.60")
    assert offer.budget == billing.TRIAL_CREDIT and offer.choice.max_cost < offer.budget
    assert offer.license is not None and offer.license.key == "llama2"
    assert not offer.license_accepted and offer.launchable


def test_a_dearer_price_book_cuts_the_time_limit_to_stay_below_the_budget() -> None:
    # 8 × 3.50 元 = 28 元/h: 30 minutes would cost 14 元; 21 minutes cost 9.80 元.
    assert recipes.time_limit_for(Decimal("28.00"), 30, Decimal("10.00")) == 21 * 60
    # Exactly on the budget is not below it: one minute less.
    assert recipes.time_limit_for(Decimal("20.00"), 30, Decimal("10.00")) == 29 * 60
    assert recipes.time_limit_for(Decimal("15.20"), 30, Decimal("10.00")) == 30 * 60


def test_busy_rtx4090s_offer_nothing_dearer_than_the_budget_and_say_when(world, newcomer) -> None:  # noqa: ANN001
    Node.objects.filter(cluster__code="xm-4090").update(free_mask=0)
    offer = recipes.demo_offer(newcomer, recipe())
    assert offer.preferred is not None and not offer.preferred.available
    # A800 (3.50 元/card-hour) fits the budget with a shorter limit; H800 has no real price.
    assert offer.choice is not None and offer.choice.gpu_model == "A800"
    assert offer.choice.max_cost < billing.TRIAL_CREDIT
    assert offer.choice.time_limit_s == 21 * 60


def test_launch_needs_the_licence_accepted_on_the_page(world, newcomer) -> None:  # noqa: ANN001
    with pytest.raises(OrderRefused):
        recipes.launch_recipe(newcomer, recipe(), accept_license=False)
    assert not Instance.objects.exists()
    model = get_asset_by_hub_id("model", recipe().model)
    assert not has_accepted_license(newcomer, model.license)


def test_the_simulated_run_shows_progress_finishes_releases_and_is_paid_by_the_trial_credit(
    world, newcomer, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    before = billing.get_wallet_summary(newcomer)
    with django_capture_on_commit_callbacks(execute=True):
        instance = recipes.launch_recipe(newcomer, recipe(), accept_license=True)
    instance.refresh_from_db()
    model = get_asset_by_hub_id("model", recipe().model)
    assert has_accepted_license(newcomer, model.license)
    assert instance.state == InstanceState.RELEASED, list(instance.events.values_list("code"))
    assert (instance.gpu_model.code, instance.cards) == ("RTX4090", 8)
    assert instance.entrypoint.startswith("torchrun ")
    assert instance.env["RECIPE"] == "llama-lora" and instance.env["MODEL_DIR"].startswith(
        "/models/"
    )
    assert instance.auto_release_at is not None
    assert instance.auto_release_at - instance.created_at <= timedelta(minutes=30, seconds=5)
    run = recipes.run_progress(instance)
    assert run.simulated and run.done and run.done_reason == "max_steps"
    assert run.step == run.max_steps == 1000
    assert run.losses[0][1] > run.losses[-1][1]  # the loss falls
    assert run.adapter == f"/pfs/adapters/{instance.env['RUN_NAME']}"
    codes = list(instance.events.order_by("pk").values_list("code", flat=True))
    assert "recipe_done" in codes and "recipe_finished" in codes and codes[-1] == "released"
    after = billing.get_wallet_summary(newcomer)
    spent = before.trial - after.trial
    assert Decimal("0") <= spent < billing.TRIAL_CREDIT
    assert after.cash == before.cash


def test_a_user_release_stops_the_follower(world, newcomer, settings) -> None:  # noqa: ANN001
    instance = recipes.launch_recipe(newcomer, recipe(), accept_license=True)
    release_instance(instance, by="alice")
    assert recipes.follow_recipe(instance.pk) == "nothing to do"


def test_structured_lines_are_parsed_and_hostile_ones_ignored() -> None:
    lines = [
        "plain text",
        '{"event": "start", "run": "r", "world_size": 8, "max_steps": 10, "resumed_from": 4}',
        '{"event": "progress", "step": 5, "max_steps": 10, "loss": 2.5, "tokens_per_s": 100.0, "eta_s": 9}',
        '{"event": "progress", "step": 6, "loss": NaN}',
        '{"event": "progress", "step": "7", "loss": 1.0}',
        '{"event": "checkpoint", "step": 6, "path": "/pfs/../etc"}',
        '{"event": "checkpoint", "step": 6, "path": "/pfs/checkpoints/r/step-6"}',
        '{"event": "exploit", "step": 99}',
        "{not json",
        '["event", "done"]',
    ]
    run = progress.summarise(lines)
    assert run.resumed_from == 4 and run.world_size == 8
    assert run.step == 6 and run.loss == 2.5 and run.losses == [(5, 2.5)]
    assert run.checkpoints == [(6, "/pfs/checkpoints/r/step-6")]
    assert not run.done and run.percent == 60
    run.add({"event": "done", "step": 10, "loss": 1.5, "adapter": "/pfs/adapters/r", "reason": "x"})
    assert run.done and run.percent == 100 and run.adapter == "/pfs/adapters/r"


def test_the_simulated_run_stops_at_its_time_limit_with_the_adapter_saved() -> None:
    env = {"RUN_NAME": "r", "MAX_STEPS": "1000", "TIME_LIMIT_S": "300", "LOG_EVERY": "10"}
    run = progress.summarise(line for _t, line in sim_recipe_lines(env, 8))
    assert run.done and run.done_reason == "time_limit" and 0 < run.step < 1000
    assert run.adapter == "/pfs/adapters/r" and run.simulated


def test_the_demo_page_prices_the_run_and_carries_the_licence(
    world, newcomer, client: Client
) -> None:  # noqa: ANN001
    client.force_login(newcomer)
    html = client.get(URL).content.decode()
    assert "7.60 元" in html  # the most it can cost, from the price book
    assert "15.20 元" in html
    assert 'name="accept_license"' in html
    assert "/pfs/adapters/" in html
    assert reverse("marketplace:license-detail", args=[recipe_license().public_id]) in html


def recipe_license():  # noqa: ANN201
    return get_asset_by_hub_id("model", recipe().model).license


def test_launching_from_the_page_without_the_checkbox_says_why(
    world, newcomer, client: Client
) -> None:  # noqa: ANN001
    client.force_login(newcomer)
    response = client.post(URL, {})
    assert response.status_code == 409
    assert 'id="demo-error"' in response.content.decode()
    assert not Instance.objects.exists()


def test_launching_from_the_page_orders_and_opens_the_instance(
    world, newcomer, client: Client, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    client.force_login(newcomer)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(URL, {"accept_license": "on"})
    instance = Instance.objects.get(created_by=newcomer)
    assert response.status_code == 302
    assert response["Location"] == reverse("slices:instance-detail", args=[instance.public_id])
    html = client.get(response["Location"]).content.decode()
    assert 'id="recipe-run"' in html and "/pfs/adapters/" in html
    assert InstanceEvent.objects.filter(instance=instance, code="recipe_done").exists()
    assert timezone.now() >= instance.created_at


def test_the_model_and_image_pages_and_the_dashboard_lead_to_the_demo(
    world, newcomer, client: Client
) -> None:  # noqa: ANN001
    client.force_login(newcomer)
    model = get_asset_by_hub_id("model", recipe().model)
    assert URL in client.get(model.get_absolute_url()).content.decode()
    dataset = get_asset_by_hub_id("dataset", recipe().dataset)
    assert URL in client.get(dataset.get_absolute_url()).content.decode()
    image = reverse("marketplace:image-detail", args=["deepspeed"])
    assert URL in client.get(image).content.decode()
    assert (
        URL
        not in client.get(reverse("marketplace:image-detail", args=["pytorch"])).content.decode()
    )
    assert URL in client.get("/").content.decode()  # the trial credit's call to action


def test_a_double_click_on_launch_starts_one_run(world, newcomer, client: Client) -> None:  # noqa: ANN001
    client.force_login(newcomer)
    html = client.get(URL).content.decode()
    key = re.search(r'name="launch_key" value="([0-9a-f-]{36})"', html).group(1)
    first = client.post(URL, {"accept_license": "on", "launch_key": key})
    second = client.post(URL, {"accept_license": "on", "launch_key": key})
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"]
    assert Instance.objects.filter(created_by=newcomer).count() == 1


def test_a_run_whose_follower_was_lost_is_followed_again(
    world, newcomer, settings, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    settings.RECIPE_FOLLOW_SECONDS = 0  # the first follower gives up at once (as if it died)
    from console.celery import app

    app.conf.task_always_eager = False
    try:
        with django_capture_on_commit_callbacks(execute=True):
            instance = recipes.launch_recipe(newcomer, recipe(), accept_license=True)
    finally:
        app.conf.task_always_eager = True
    instance.refresh_from_db()
    assert instance.state == InstanceState.PROVISIONING  # nothing ran the queued tasks
    from slices.services.provisioning import provision_instance

    assert provision_instance(instance.pk) == "running"
    assert recipes.follow_running_recipes() == 1  # the beat finds it unfollowed: follows it
    instance.refresh_from_db()
    assert instance.state in (InstanceState.RELEASING, InstanceState.RELEASED)
    assert InstanceEvent.objects.filter(instance=instance, code="recipe_done").exists()
