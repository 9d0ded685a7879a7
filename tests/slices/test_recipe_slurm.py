"""The LLaMA LoRA recipe as a 2-node Slurm job (issue 31) on the simulated fleet: the demo's
second offer (2 whole nodes, priced and cut to the trial credit like the one-node run), the
launch as a slice in job mode whose job is the recipe's batch script with the run's environment
as data, the run through the simulated Slurm and the slice released when the job ends. The same
recipe on real Slurm: ``tests/slices/test_recipe_runs.py``."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client

from billing import services as billing
from billing.seed import seed_default_prices
from marketplace import recipes as catalogue_recipes
from marketplace.catalogue import CatalogueError
from slices.choices import InstanceState
from slices.models import Instance, InstanceEvent, SlurmCluster, SlurmJob
from slices.services import recipes
from tests.slices.factories import load_small_fleet

pytestmark = pytest.mark.django_db
URL = "/demo/llama-7b/"


@pytest.fixture
def world(full_catalogue, settings, sim_driver, tmp_path) -> None:  # noqa: ANN001
    settings.SIM_TIME_SCALE = 0
    settings.STATE_DIR = tmp_path
    seed_default_prices()
    load_small_fleet()


@pytest.fixture
def newcomer(alice):  # noqa: ANN001, ANN201
    assert billing.grant_trial_credit(alice)
    return alice


def test_the_recipe_ships_a_2_node_batch_script() -> None:
    recipe = catalogue_recipes.get_demo("llama-7b")
    assert recipe is not None and recipe.offers_slurm and recipe.slurm_nodes == 2
    on_slurm = recipe.on_slurm()
    # The allocator's smallest slice (64 A800), the job on 2 of its nodes, 8 GPUs each.
    assert on_slurm.cards == 64 and on_slurm.gpu_model == "A800" and on_slurm.cards_per_node == 8
    assert on_slurm.mode == "slurm" and on_slurm.budget == "balance"
    script = on_slurm.batch_script()
    assert script.startswith("#!/bin/bash\n")
    # srun across the nodes; torch's distributed settings from Slurm's variables.
    assert 'srun --nodes="$NNODES" --ntasks-per-node=1' in script
    for name in ("SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_NODEID"):
        assert name in script


def test_a_manifest_slurm_run_is_checked(tmp_path) -> None:  # noqa: ANN001
    source = catalogue_recipes.RECIPES_DIR / "llama-lora"
    for bad, says in (
        ("slurm:\n  nodes: 1\n  script: slurm.sbatch\n", "slurm.nodes"),
        ("slurm:\n  nodes: 2\n  script: other.sh\n", "slurm.script"),
    ):
        target = tmp_path / says / "llama-lora"
        target.mkdir(parents=True)
        for f in source.iterdir():
            if f.is_file():
                (target / f.name).write_bytes(f.read_bytes())
        text = (source / "manifest.yaml").read_text()
        start = text.index("slurm:\n")
        end = text.index("# Defaults of the run's environment")
        (target / "manifest.yaml").write_text(text[:start] + bad + text[end:])
        with pytest.raises(CatalogueError, match=says):
            catalogue_recipes.read_recipe(target)


def test_the_slurm_offer_is_paid_from_the_balance_and_cut_to_it(world, newcomer) -> None:  # noqa: ANN001
    recipe = catalogue_recipes.get_demo("llama-7b").on_slurm()
    # The trial credit alone pays for no useful run of a 64-card slice: nothing is offered.
    assert recipes.demo_offer(newcomer, recipe).choice is None
    billing.grant_voucher(newcomer, Decimal("100"), reason="test", valid_days=30)
    offer = recipes.demo_offer(newcomer, recipe)
    assert offer.budget == Decimal("110.00")
    assert offer.choice is not None and offer.choice.gpu_model == "A800"
    assert offer.choice.per_hour == Decimal("224.00")  # 64 × 3.50 元
    assert offer.choice.time_limit_s == 29 * 60  # cut so that it stays below the balance
    assert offer.choice.max_cost < offer.budget and offer.launchable


def test_the_slurm_run_is_a_slice_in_job_mode_that_releases_itself(
    world, newcomer, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    billing.grant_voucher(newcomer, Decimal("500"), reason="test", valid_days=30)
    client = Client()
    client.force_login(newcomer)
    page = client.get(URL).content.decode()
    assert 'id="demo-slurm-launch"' in page and 'id="demo-slurm-price"' in page
    # In both languages (zh-hans is the default).
    assert 'id="accept-license-slurm"' in page  # the licence is accepted on this form too
    assert "在 Slurm 上运行" in page and "2 × 8 张 A800" in page and "最长 30 分钟" in page
    english = client.get(URL, HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "Run on Slurm" in english and "as a 2-node Slurm job" in english
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(
            URL,
            {"mode": "slurm", "accept_license": "on", "gpu_model": "A800",
             "launch_key": "7b0c9a1e-7c0b-4c55-9d59-111111111111"},
        )  # fmt: skip
    assert answer.status_code == 302, answer.content.decode()[:2000]
    instance = Instance.objects.filter(created_by=newcomer).get()
    assert instance.cards == 64 and instance.nodes.count() == 8
    assert instance.entrypoint == recipes.SLURM_IDLE  # the job is the work, not a command
    cluster = SlurmCluster.objects.get(instance=instance)
    assert cluster.release_on_job_end
    job = SlurmJob.objects.get(instance=instance, from_order=True)
    assert job.nodes == 2 and job.gpus_per_node == 8
    assert job.script == catalogue_recipes.get_demo("llama-7b").batch_script()
    run = instance.env["RUN_NAME"]
    assert job.name == run and job.environment["RUN_NAME"] == run
    assert job.environment["MODEL_DIR"] == instance.env["MODEL_DIR"]
    assert "PATH" not in job.environment and "HOME" not in job.environment
    assert job.time_limit_min == 30 and int(job.environment["TIME_LIMIT_S"]) < 30 * 60
    # The tasks ran inline: the slice ran, the job was submitted to the simulated Slurm, ran
    # on 2 nodes, and the job follower released the slice when it ended (the one-node
    # follower left it alone: "slurm job").
    assert job.slurm_state == "COMPLETED", job.output
    assert "[simulated Slurm]" in job.output and len(job.node_list.split(",")) in (1, 2)
    assert recipes.output_lines(instance) == job.output.splitlines()
    assert instance.state in (InstanceState.RELEASING, InstanceState.RELEASED)
    codes = list(InstanceEvent.objects.filter(instance=instance).values_list("code", flat=True))
    assert codes.index("job_submitted") < codes.index("job_release")
    assert recipes.live_demo_run(newcomer) is None
