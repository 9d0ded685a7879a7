"""The LLaMA LoRA recipe really runs: on the CPU, through the ssh driver, on an sshd test host.

The test makes a tiny LLaMA-architecture model (``LlamaConfig`` with tiny sizes, a word-level
tokenizer trained in-process) and a tiny instruction dataset, puts them where the catalogue's
model and dataset are mounted from, and launches the demo recipe on a 2-card RTX 4090 host of the
small fleet whose node is a real sshd test host (``runtime=process``). torchrun starts 2 processes
(gloo); the console follows the node's output over SSH, parses the progress lines and releases the
instance when the recipe prints ``done``. A second run resumes from the first run's checkpoint.

The recipe's Python (torch, transformers, peft) belongs to the image, not to the console's
environment: it runs in its own virtualenv, ``var/recipe-venv`` (``make recipe-env`` builds it
from the recipe's requirements.txt and keeps it between runs; this module builds it too if it is
missing, so it never skips).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from billing import services as billing
from billing.models import UsageSession
from billing.seed import seed_default_prices
from marketplace import recipes as catalogue_recipes
from slices.choices import InstanceState
from slices.models import Instance, Node
from slices.services import recipes
from tests.slices.factories import load_small_fleet
from tests.support.sshd import SshHostPool, configure_ssh_fleet, ssh_hosts  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=False), pytest.mark.recipe]

ROOT = Path(__file__).resolve().parents[2]
RECIPE_DIR = ROOT / "marketplace" / "recipes" / "llama-lora"
VENV = Path(os.environ.get("RECIPE_VENV", ROOT / "var" / "recipe-venv"))
TINY = Path(__file__).with_name("recipe_tiny.py")
APPS_REQUIREMENTS = ROOT / "marketplace" / "apps" / "requirements.txt"


def recipe_python() -> Path:
    """The recipe environment's Python, built from requirements.txt if it is not there yet."""
    python = VENV / "bin" / "python"
    stamp = VENV / ".requirements"
    files = [RECIPE_DIR / "requirements.txt", APPS_REQUIREMENTS]  # as the Makefile's recipe-env
    wanted = "".join(f.read_text() for f in files)
    if not python.exists() or not stamp.exists() or stamp.read_text() != wanted:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)  # noqa: S603
        subprocess.run(  # noqa: S603
            [str(VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
            + [arg for f in files for arg in ("-r", str(f))],
            check=True,
        )
        stamp.write_text(wanted)
    return python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def host(full_catalogue, settings, ssh_hosts: SshHostPool, tmp_path: Path):  # noqa: ANN001, ANN201, F811
    """One RTX 4090 node of the small fleet pointed at a real sshd test host, the tiny model and
    dataset where the catalogue mounts them from, the recipe environment on the run's PATH."""
    python = recipe_python()
    seed_default_prices()
    load_small_fleet()
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SSH_CONNECT_TIMEOUT = 5.0
    settings.SLICES_SSH_COMMAND_TIMEOUT = 60.0
    settings.RECIPE_FOLLOW_INTERVAL = 0.5
    settings.RECIPE_FOLLOW_SECONDS = 600
    node = Node.objects.filter(cluster__code="xm-4090").order_by("hostname").first()
    Node.objects.filter(cluster__code="xm-4090").exclude(pk=node.pk).update(free_mask=0)
    fleet = configure_ssh_fleet(
        settings, ssh_hosts.get(1), [node], tmp_path, client_key=ssh_hosts.client_key
    )
    recipe = catalogue_recipes.get_demo("llama-7b")
    model = fleet.asset_root / "models" / recipe.model
    dataset = fleet.asset_root / "datasets" / recipe.dataset
    subprocess.run([str(python), str(TINY), str(model), str(dataset)], check=True)  # noqa: S603
    # The node's PATH is the operator's (no environment sets it): the recipe's venv on the host.
    settings.SLICES_NODE_PATH = f"{python.parent}:/usr/local/bin:/usr/bin:/bin"
    settings.RECIPE_EXTRA_ENV = {
        "RECIPE_DIR": str(RECIPE_DIR),
        "MASTER_PORT": str(_free_port()),
        "MAX_STEPS": "8",
        "SAVE_EVERY": "4",
        "LOG_EVERY": "1",
        "LR": "0.02",
        "LORA_TARGETS": "q_proj,k_proj,v_proj,o_proj",
        "BATCH_SIZE": "4",
        "SEQ_LEN": "64",
        "OMP_NUM_THREADS": "1",
        "HOME": str(tmp_path),
    }
    return fleet


def _run(user, capture, **env):  # noqa: ANN001, ANN003, ANN202
    """Launch the demo recipe on 2 cards (torchrun --nproc_per_node 2) and wait for its end."""
    recipe = replace(catalogue_recipes.get_demo("llama-7b"), cards=2)
    with capture(execute=True):
        instance = recipes.launch_recipe(user, recipe, accept_license=True)
    instance.refresh_from_db()
    return instance, recipes.run_progress(instance)


def _codes(instance: Instance) -> list[str]:
    return list(instance.events.order_by("pk").values_list("code", flat=True))


def _story(instance: Instance) -> str:
    """The instance's events in full (what a failed assertion shows)."""
    return "\n".join(
        f"{code} {step} {node}: {text} {params}"
        for code, step, node, text, params in instance.events.order_by("pk").values_list(
            "code", "step", "node", "text", "params"
        )
    )


def test_the_recipe_trains_checkpoints_resumes_and_saves_the_adapter_over_ssh(
    host, alice, settings, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    assert billing.grant_trial_credit(alice)
    before = billing.get_wallet_summary(alice)

    first, run = _run(alice, django_capture_on_commit_callbacks)
    logs = "\n".join(recipes.output_lines(first))
    assert first.state == InstanceState.RELEASED, (_codes(first), logs[-3000:])
    assert first.driver == "ssh" and first.entrypoint.startswith("torchrun ")
    assert run.started and not run.simulated and run.world_size == 2 and run.device == "cpu"
    assert run.done and run.done_reason == "max_steps" and run.step == 8
    assert [s for s, _ in run.losses] == list(range(1, 9))
    losses = [v for _, v in run.losses]
    assert losses[-1] < losses[0], losses  # the loss goes down
    assert sum(losses[-3:]) < sum(losses[:3]), losses
    assert run.tokens_per_s and run.tokens_per_s > 0
    name = first.env["RUN_NAME"]
    pfs = host.pfs_root / str(alice.public_id)
    assert run.checkpoints == [
        (4, f"/pfs/checkpoints/{name}/step-4"),
        (8, f"/pfs/checkpoints/{name}/step-8"),
    ]
    for step in (4, 8):
        saved = pfs / "checkpoints" / name / f"step-{step}"
        assert (saved / "adapter_model.safetensors").is_file()
        assert json.loads((saved / "trainer_state.json").read_text())["step"] == step
    assert run.adapter == f"/pfs/adapters/{name}"
    assert (pfs / "adapters" / name / "adapter_model.safetensors").is_file()
    assert (pfs / "adapters" / name / "adapter_config.json").is_file()
    codes = _codes(first)
    assert "recipe_done" in codes and "recipe_finished" in codes and codes[-1] == "released"
    print(f"\nrecipe run 1: losses {losses}, {run.tokens_per_s} tokens/s")  # noqa: T201

    # A second run resumes from the first one's last checkpoint (RESUME_FROM) and goes on.
    settings.RECIPE_EXTRA_ENV = {
        **settings.RECIPE_EXTRA_ENV,
        "MAX_STEPS": "12",
        "MASTER_PORT": str(_free_port()),
        "RESUME_FROM": f"/pfs/checkpoints/{name}/step-8",
    }
    second, resumed = _run(alice, django_capture_on_commit_callbacks)
    assert second.state == InstanceState.RELEASED, _codes(second)
    assert resumed.resumed_from == 8
    assert [s for s, _ in resumed.losses] == [9, 10, 11, 12]
    assert resumed.losses[0][1] < losses[0]  # it starts where the first run got to, not afresh
    assert resumed.done and resumed.step == 12
    again = second.env["RUN_NAME"]
    assert (pfs / "checkpoints" / again / "step-12" / "adapter_model.safetensors").is_file()
    print(f"recipe run 2 (resumed at 8): losses {[v for _, v in resumed.losses]}")  # noqa: T201

    # Both runs were paid by the trial credit, to the second; cash untouched.
    after = billing.get_wallet_summary(alice)
    spent = before.trial - after.trial
    charged = sum(
        (
            s.charged
            for s in UsageSession.objects.filter(
                resource_id__in=[str(first.public_id), str(second.public_id)]
            )
        ),
        Decimal("0"),
    )
    # Exactly what the two sessions charged (a fast machine may finish in a second or two, so
    # the amount itself can round to 0.00); never more than the trial credit.
    assert spent == charged and Decimal("0") <= spent < billing.TRIAL_CREDIT
    assert (
        UsageSession.objects.filter(
            resource_id__in=[str(first.public_id), str(second.public_id)], state="closed"
        ).count()
        == 2
    )
    assert after.cash == before.cash


# ---------------------------------------------------------------------------------------------
# The same recipe as a 2-node job on the slice's REAL Slurm (issue 31)
# ---------------------------------------------------------------------------------------------

SLURM_HOSTS = 8  # the allocator's smallest slice: 64 A800, 8 nodes


@pytest.fixture
def slurm_fleet(full_catalogue, settings, ssh_hosts: SshHostPool, tmp_path: Path):  # noqa: ANN001, ANN201, F811
    """The A800 cluster's 8 nodes on 8 sshd test hosts with Debian's real Slurm (the slice's
    own, started by the console), the tiny model and dataset, the recipe environment on PATH."""
    import shutil
    import tempfile

    from tests.support.sshd import processes_under, stop_pids

    python = recipe_python()
    seed_default_prices()
    load_small_fleet()
    run_dir = Path(tempfile.mkdtemp(prefix="gpc-slurm-"))
    run_dir.chmod(0o755)  # slurmrestd runs as nobody
    settings.SLICES_SLURM_RUN_DIR = str(run_dir)
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    settings.SLICES_SSH_CONNECT_TIMEOUT = 5.0
    settings.SLICES_SSH_COMMAND_TIMEOUT = 60.0
    nodes = list(Node.objects.filter(cluster__code="yc-a800").order_by("hostname"))
    assert len(nodes) == SLURM_HOSTS
    fleet = configure_ssh_fleet(
        settings, ssh_hosts.get(SLURM_HOSTS), nodes, tmp_path, client_key=ssh_hosts.client_key
    )
    recipe = catalogue_recipes.get_demo("llama-7b")
    model = fleet.asset_root / "models" / recipe.model
    dataset = fleet.asset_root / "datasets" / recipe.dataset
    subprocess.run([str(python), str(TINY), str(model), str(dataset)], check=True)  # noqa: S603
    settings.SLICES_NODE_PATH = f"{python.parent}:/usr/local/bin:/usr/bin:/bin"
    settings.RECIPE_EXTRA_ENV = {
        "RECIPE_DIR": str(RECIPE_DIR),
        "MASTER_PORT": str(_free_port()),
        "NPROC_PER_NODE": "1",  # one process per node on the CPU: world size 2
        "MAX_STEPS": "6",
        "SAVE_EVERY": "3",
        "LOG_EVERY": "1",
        "LR": "0.02",
        "LORA_TARGETS": "q_proj,k_proj,v_proj,o_proj",
        "BATCH_SIZE": "4",
        "SEQ_LEN": "64",
        "OMP_NUM_THREADS": "1",
        "HF_HOME": str(tmp_path / "hf"),
    }
    yield fleet
    stop_pids(processes_under(run_dir))
    shutil.rmtree(run_dir, ignore_errors=True)


def test_the_recipe_runs_as_a_2_node_job_on_the_slices_real_slurm(
    slurm_fleet, funded, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    import time

    from slices.models import SlurmJob
    from slices.services import slurm_jobs

    recipe = catalogue_recipes.get_demo("llama-7b").on_slurm()
    with django_capture_on_commit_callbacks(execute=True):
        instance = recipes.launch_recipe(funded, recipe, accept_license=True)
    instance.refresh_from_db()
    job = SlurmJob.objects.filter(instance=instance, from_order=True).first()
    assert job is not None, _story(instance)
    # The job follower (a Celery task in production) until the job ended and the slice went.
    deadline = time.monotonic() + 420
    while instance.state == InstanceState.RUNNING:
        with django_capture_on_commit_callbacks(execute=True):
            slurm_jobs.follow_jobs(instance.pk)
        instance.refresh_from_db()
        assert time.monotonic() < deadline, (job.slurm_state, _codes(instance))
        time.sleep(0.5)
    job.refresh_from_db()
    assert job.slurm_state == "COMPLETED" and job.exit_code == 0, job.output[-3000:]
    assert instance.state == InstanceState.RELEASED, _codes(instance)
    codes = _codes(instance)
    assert codes.index("job_ended") < codes.index("job_release") < codes.index("released")
    # Two nodes, one torchrun each, one process group across them (world size 2, gloo).
    assert len(job.node_list) and job.nodes == 2
    assert "2 node(s) x 1 process(es)" in job.output
    run = recipes.run_progress(instance)
    assert run.started and not run.simulated and run.world_size == 2 and run.device == "cpu"
    assert run.done and run.done_reason == "max_steps" and run.step == 6
    losses = [v for _, v in run.losses]
    assert [s for s, _ in run.losses] == list(range(1, 7)) and losses[-1] < losses[0], losses
    name = instance.env["RUN_NAME"]
    pfs = slurm_fleet.pfs_root / str(funded.public_id)
    for step in (3, 6):
        saved = pfs / "checkpoints" / name / f"step-{step}"
        assert json.loads((saved / "trainer_state.json").read_text())["step"] == step
    assert (pfs / "adapters" / name / "adapter_model.safetensors").is_file()
    print(f"\nrecipe on 2 Slurm nodes: losses {losses}, {run.tokens_per_s} tokens/s")  # noqa: T201
