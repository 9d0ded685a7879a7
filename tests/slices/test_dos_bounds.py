"""Recipe parameters cannot buy unbounded work: the manifest's bounds (checked by the loader), the
launch's check of what it runs, a simulated recipe that costs O(1) per read whatever its steps, a
follower bounded per task run, and time limits on every task.

(The whole embedded console under the worst legal demo runs: tests/slices/test_dos_embedded.py.)
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
import yaml
from django.core.cache import cache
from django.utils import translation

from billing import services as billing
from billing.seed import seed_default_prices
from console.celery import app as celery_app
from marketplace import recipes as catalogue_recipes
from marketplace.catalogue import CatalogueError
from slices import progress, tasks
from slices.choices import InstanceState
from slices.drivers.sim import (
    SIM_CHECKPOINT_SECONDS,
    SIM_RECIPE_LOAD_SECONDS,
    SIM_RECIPE_TOKENS_PER_GPU_S,
    _SimRecipe,
    sim_recipe_lines,
)
from slices.errors import OrderRefused
from slices.models import Instance, InstanceEvent
from slices.services import recipes
from slices.services.provisioning import provision_instance
from tests.slices.factories import load_small_fleet

SHIPPED = catalogue_recipes.RECIPES_DIR / "llama-lora"


# ---------------------------------------------------------------------------------------------
# The manifest's bounds
# ---------------------------------------------------------------------------------------------


def _copy(tmp_path: Path, **changes: object) -> Path:
    root = tmp_path / "recipes"
    target = root / "llama-lora"
    shutil.copytree(SHIPPED, target)
    data = yaml.safe_load((target / "manifest.yaml").read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        elif isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    (target / "manifest.yaml").write_text(yaml.safe_dump(data, allow_unicode=True))
    return root


def test_the_shipped_demo_bounds_every_parameter_its_work_grows_with() -> None:
    recipe = catalogue_recipes.get_demo("llama-7b")
    assert recipe is not None
    assert recipe.bounds["MAX_STEPS"] == (1, 5000)
    for name, (low, high) in catalogue_recipes.PARAMETER_LIMITS.items():
        own = recipe.bounds[name]
        assert low <= own[0] <= own[1] <= high, name  # narrowed, never widened
    recipe.check_parameters(recipe.env)  # its defaults are within them


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"env": {"MAX_STEPS": "100000000"}}, "MAX_STEPS must be a whole number from 1 to 5000"),
        ({"env": {"BATCH_SIZE": "4096"}}, "BATCH_SIZE must be a whole number from 1 to 64"),
        ({"env": {"LOG_EVERY": "ten"}}, "LOG_EVERY must be a whole number"),
        # 1,000 steps saving every step: 1,000 checkpoints; at most 200 (every 5 steps or more).
        ({"env": {"SAVE_EVERY": "1"}}, "SAVE_EVERY must be a whole number from 5 to 5000"),
        ({"bounds": {"MAX_STEPS": [1, 10**9]}}, "beyond the loader's fixed limits"),
        ({"bounds": {"MAX_STEPS": [10, 1]}}, r"bounds.MAX_STEPS must be \[least, most\]"),
        ({"bounds": {"MAX_STEPS": "big"}}, r"must be \[least, most\]"),
        ({"bounds": ["MAX_STEPS"]}, "bounds must map names"),
        # Without a bounds section the loader's fixed limits still hold.
        ({"bounds": None, "env": {"MAX_STEPS": "200000"}}, "from 1 to 100000"),
        ({"env": {"A\n": "x"}}, "is not NAME: value"),
    ],
)
def test_the_loader_refuses_parameters_outside_their_bounds(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    root = _copy(tmp_path, **changes)
    with pytest.raises(CatalogueError, match=message):
        catalogue_recipes.read_recipes(root)


def test_a_manifest_may_bound_more_names_and_without_bounds_gets_the_fixed_limits(
    tmp_path: Path,
) -> None:
    recipe = catalogue_recipes.read_recipes(_copy(tmp_path, bounds={"WARMUP": [0, 100]}))[0]
    assert recipe.bounds["WARMUP"] == (0, 100)
    with pytest.raises(catalogue_recipes.ParameterOutOfBounds) as refused:
        recipe.check_parameters({"WARMUP": "101"})
    assert (refused.value.name, refused.value.low, refused.value.high) == ("WARMUP", 0, 100)
    bare = catalogue_recipes.read_recipes(_copy(tmp_path / "bare", bounds=None))[0]
    assert bare.bounds == catalogue_recipes.PARAMETER_LIMITS


# ---------------------------------------------------------------------------------------------
# The simulated recipe: a closed form, O(1) per read
# ---------------------------------------------------------------------------------------------


def _reference(env: dict[str, str], world: int, scale: float) -> list[tuple[float, str, int]]:
    """The run step by step (what the simulator did before it was a closed form): (seconds,
    event, step) of every line. Only for small runs."""
    steps, log, save = int(env["MAX_STEPS"]), int(env["LOG_EVERY"]), int(env["SAVE_EVERY"])
    limit = float(env.get("TIME_LIMIT_S", 0))
    step_s = world * 4 * 512 / (world * SIM_RECIPE_TOKENS_PER_GPU_S)
    out = [(1.0, "", 0), (2.0, "", 0), (SIM_RECIPE_LOAD_SECONDS, "start", 0)]
    t, step = SIM_RECIPE_LOAD_SECONDS, 0
    while step < steps:
        step += 1
        t += step_s
        if step % log == 0 or step == steps:
            out.append((t, "progress", step))
        if save and step % save == 0 and step < steps:
            t += SIM_CHECKPOINT_SECONDS
            out.append((t, "checkpoint", step))
        if limit and (t + 2 * step_s) * scale + 30 > limit:
            break
    out += [(t + 3.0, "checkpoint", step), (t + 4.0, "done", step)]
    return out


def _shape(line: str) -> tuple[str, int]:
    data = progress.parse_line(line) or {}
    return str(data.get("event", "")), int(data.get("step") or 0)


@pytest.mark.parametrize("steps", [1, 7, 10, 100, 1000])
@pytest.mark.parametrize("log_every", [1, 3, 10])
@pytest.mark.parametrize("save_every", [0, 1, 4, 100])
@pytest.mark.parametrize(("limit", "scale"), [(0, 0.0), (0, 1.0), (300, 1.0), (60, 0.01)])
def test_the_closed_form_prints_what_the_step_by_step_run_printed(
    steps: int, log_every: int, save_every: int, limit: int, scale: float
) -> None:
    env = {
        "RUN_NAME": "r",
        "MAX_STEPS": str(steps),
        "LOG_EVERY": str(log_every),
        "SAVE_EVERY": str(save_every),
        "TIME_LIMIT_S": str(limit),
    }
    expected = _reference(env, 8, scale)
    got = sim_recipe_lines(env, 8, time_scale=scale)
    assert len(got) == len(expected)
    for (t, line), (want_t, event, step) in zip(got, expected, strict=True):
        assert t == pytest.approx(want_t)
        if event:
            assert _shape(line) == (event, step)


def test_a_read_returns_a_window_of_the_run_whatever_the_elapsed_time() -> None:
    env = {"RUN_NAME": "w", "MAX_STEPS": "3000", "LOG_EVERY": "2", "SAVE_EVERY": "250"}
    recipe = _SimRecipe.from_env(env, 8, time_scale=0.5)
    whole = recipe.lines()
    assert len(whole) == recipe.total
    for elapsed in (0.0, 0.9, 50.0, 700.0, 1e9):
        due = [line for at, line in whole if at * 0.5 <= elapsed]
        for offset in (0, 1, 3, 500, 1499, len(whole) - 1, len(whole) + 10):
            assert recipe.window(offset, elapsed, 200) == due[offset : offset + 200]


def test_a_huge_step_count_costs_no_more_per_read_than_a_small_one() -> None:
    """MAX_STEPS=100000000 (a launch refuses it; the simulator clamps it to the loader's fixed
    limit): a read builds only the lines it returns. Step by step, this run took minutes and
    gigabytes per read; the closed form answers at once (the 60 s is only a hang detector)."""
    env = {"RUN_NAME": "dos", "MAX_STEPS": "100000000", "LOG_EVERY": "1", "SAVE_EVERY": "1"}
    recipe = _SimRecipe.from_env(env, 1, time_scale=0.0)
    reads: list[list[str]] = []

    def read() -> None:
        for offset in (0, 5_000, 150_000, recipe.total - 2):
            reads.append(recipe.window(offset, 1e12, 10_000))

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "a read of the simulated recipe did not return"
    assert recipe.max_steps == catalogue_recipes.PARAMETER_LIMITS["MAX_STEPS"][1]
    assert [len(r) for r in reads] == [1000, 1000, 1000, 2]  # capped per read
    assert json.loads(reads[-1][-1])["event"] == "done"


# ---------------------------------------------------------------------------------------------
# Launch, follower and tasks
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def world(full_catalogue, settings, alice):  # noqa: ANN001, ANN201
    settings.SIM_TIME_SCALE = 0
    settings.RECIPE_FOLLOW_INTERVAL = 0.01
    settings.RECIPE_FOLLOW_SECONDS = 0
    seed_default_prices()
    load_small_fleet()
    assert billing.grant_trial_credit(alice)
    return alice


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("extra", "name", "bounds"),
    [
        ({"MAX_STEPS": "100000000"}, "MAX_STEPS", "from 1 to 5000"),
        ({"SAVE_EVERY": "1"}, "SAVE_EVERY", "from 5 to 5000"),  # 1,000 checkpoints
        ({"SEQ_LEN": "1e9"}, "SEQ_LEN", "from 16 to 4096"),
    ],
)
def test_a_launch_refuses_a_parameter_outside_the_recipes_bounds(
    world, settings, extra: dict[str, str], name: str, bounds: str
) -> None:  # noqa: ANN001
    settings.RECIPE_EXTRA_ENV = extra
    recipe = catalogue_recipes.get_demo("llama-7b")
    with pytest.raises(OrderRefused) as refused:
        recipes.launch_recipe(world, recipe, accept_license=True)
    assert refused.value.http_status == 400
    with translation.override("en"):
        message = refused.value.message()
    assert name in message and bounds in message, message
    assert not Instance.objects.exists()


def _running_demo(user, settings) -> Instance:  # noqa: ANN001
    recipe = catalogue_recipes.get_demo("llama-7b")
    celery_app.conf.task_always_eager = False  # provision it here, follow it by hand
    try:
        instance = recipes.launch_recipe(user, recipe, accept_license=True)
    finally:
        celery_app.conf.task_always_eager = True
    assert provision_instance(instance.pk) == "running"
    return instance


@pytest.mark.django_db
def test_the_follower_stores_a_bounded_number_of_lines_per_task_run(world, settings) -> None:  # noqa: ANN001
    # The worst the demo allows: its most steps, a progress line each, no checkpoints.
    settings.RECIPE_EXTRA_ENV = {"MAX_STEPS": "5000", "LOG_EVERY": "1", "SAVE_EVERY": "0"}
    instance = _running_demo(world, settings)
    stored = InstanceEvent.objects.filter(instance=instance, step=recipes.RUN_STEP)
    results, counts = [], []
    while not results or results[-1] == "again":
        results.append(recipes.follow_recipe(instance.pk))
        counts.append(stored.count())
        assert len(results) < 10
    # 5,000 progress lines and 5 more: three task runs of at most 2,000 lines each.
    assert results == ["again", "again", "finished"]
    assert counts == [recipes.FOLLOW_MAX_LINES, 2 * recipes.FOLLOW_MAX_LINES, 5005]
    run = recipes.run_progress(instance)
    assert run.done and run.step == 5000 and len(run.losses) == 5000
    instance.refresh_from_db()
    assert instance.state in (InstanceState.RELEASING, InstanceState.RELEASED)


@pytest.mark.django_db
def test_between_task_runs_the_beat_does_not_start_a_second_follower(world, settings) -> None:  # noqa: ANN001
    settings.RECIPE_EXTRA_ENV = {"MAX_STEPS": "5000", "LOG_EVERY": "1", "SAVE_EVERY": "0"}
    instance = _running_demo(world, settings)
    assert recipes.follow_recipe(instance.pk) == "again"
    # No lock is held between runs, but the follower is coming back: the beat leaves it alone.
    assert recipes.follow_running_recipes() == 0
    cache.clear()  # the worker that would have come back is gone (its mark expires)
    assert recipes.follow_running_recipes() == 1  # followed again (inline here: to the end)
    instance.refresh_from_db()
    assert instance.state in (InstanceState.RELEASING, InstanceState.RELEASED)


def test_every_task_has_soft_and_hard_time_limits_within_the_visibility_timeout(
    settings,  # noqa: ANN001
) -> None:
    conf = celery_app.conf
    found = [
        getattr(tasks, name)
        for name in dir(tasks)
        if name.endswith("_task") and hasattr(getattr(tasks, name), "delay")
    ]
    assert len(found) >= 9
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    for task in found:
        soft = task.soft_time_limit or conf.task_soft_time_limit
        hard = task.time_limit or conf.task_time_limit
        assert soft and hard and soft < hard < visibility, task.name
    follower = tasks.follow_recipe_task
    assert follower.time_limit < conf.task_time_limit
    assert follower.soft_time_limit > settings.RECIPE_FOLLOW_SECONDS + 60
