"""Demo launches racing on PostgreSQL (SQLite ignores row locks): one live demo run per account,
whatever the launch keys of concurrent clicks."""

from __future__ import annotations

import pytest

from billing import services as billing
from billing.seed import seed_default_prices
from marketplace import recipes as catalogue_recipes
from slices.models import Instance
from slices.services import recipes
from tests.slices.factories import load_small_fleet
from tests.support.concurrency import race

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_concurrent_demo_launches_of_one_account_start_one_run(
    full_catalogue,
    settings,
    alice,  # noqa: ANN001
) -> None:
    settings.SIM_TIME_SCALE = 0
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    load_small_fleet()
    seed_default_prices()
    assert billing.grant_trial_credit(alice)
    recipe = catalogue_recipes.get_demo("llama-7b")
    from console.celery import app

    app.conf.task_always_eager = False  # the runs stay live: nothing provisions or follows them
    try:
        results = race(
            6,
            lambda i: recipes.launch_recipe(
                alice, recipe, accept_license=True, idempotency_key=f"demo:key-{i}"
            ),
        )
    finally:
        app.conf.task_always_eager = True
    runs = [r for r in results if isinstance(r, Instance)]
    refused = [r for r in results if isinstance(r, recipes.DemoRunLive)]
    assert len(runs) == 1 and len(refused) == 5, results
    assert {r.live.pk for r in refused} == {runs[0].pk}
    assert Instance.objects.filter(created_by=alice).count() == 1
