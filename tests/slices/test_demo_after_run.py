"""The demo's instance page after the run (issue 21, "The demo page after the run"): no "starting"
banner nor "automatically at …" once released; the next step links to the /pfs file browser at
the adapter's folder (no SSH: the instance is gone); the "Latest checkpoint" card agrees with the
training card; the /pfs usage counts what the run wrote (the simulated fleet writes small, labelled
files for its checkpoints and adapter)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing import services as billing
from billing.seed import seed_default_prices
from slices.choices import EventKind, InstanceState
from slices.drivers.sim import write_sim_recipe_files
from slices.models import Instance, InstanceEvent, PfsUsage
from slices.services import storage
from slices.templatetags.recipes import pfs_browse_url
from tests.slices.factories import load_small_fleet, make_instance

pytestmark = pytest.mark.django_db
URL = "/demo/llama-7b/"


@pytest.fixture
def pfs(settings, tmp_path: Path) -> Path:
    settings.SLICES_PFS_CONSOLE_ROOT = str(tmp_path / "pfs")
    return tmp_path / "pfs"


@pytest.fixture
def world(full_catalogue, settings, pfs) -> Path:  # noqa: ANN001
    settings.SIM_TIME_SCALE = 0
    settings.RECIPE_FOLLOW_INTERVAL = 0.01
    seed_default_prices()
    load_small_fleet()
    return pfs


@pytest.fixture
def newcomer(alice):  # noqa: ANN001, ANN201
    assert billing.grant_trial_credit(alice)
    return alice


def _part(html: str, element_id: str) -> str:
    """The text of the element with ``element_id`` (up to its first closing tag)."""
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</', html, re.S)
    assert found, element_id
    return found.group(1)


def test_after_the_run_the_instance_page_agrees_with_the_run(
    world, newcomer, client: Client, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    client.force_login(newcomer)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(URL, {"accept_license": "on"})
    instance = Instance.objects.get(created_by=newcomer)
    assert instance.state == InstanceState.RELEASED
    run = instance.env["RUN_NAME"]
    html = client.get(response["Location"]).content.decode()

    # No "starting" banner (neither the old flash nor the card's) and no future release time.
    assert "示例正在启动" not in html and 'id="recipe-starting"' not in html
    assert "自动释放" not in _part(html, "instance-release-when")
    ended = timezone.localtime(instance.ended_at).strftime("%Y-%m-%d %H:%M")
    assert ended in _part(html, "instance-release-when")  # when it was released, not a plan

    # The next step: the file browser at the adapter's folder, not SSH.
    assert "通过 SSH 下载适配器" not in html and "SSH" not in _part(html, "recipe-next")
    adapter_url = f"/storage/pfs/?path=adapters%2F{run}"
    assert 'id="recipe-adapter-link"' in html and f'href="{adapter_url}"' in html

    # The checkpoint card shows the run's last checkpoint, like the training card.
    assert "暂无：任务写入" not in html
    assert "1000" in _part(html, "instance-checkpoint")
    assert f"/pfs/checkpoints/{run}/step-1000" in html
    assert instance.checkpoint["step"] == 1000  # found on the PFS while the run was followed

    # The simulated run wrote real (small, labelled) files; the usage counts them.
    home = world / storage.account_dir(newcomer)
    config = json.loads((home / "adapters" / run / "adapter_config.json").read_text())
    assert config["simulated"] is True and config["peft_type"] == "LORA"
    assert (home / "adapters" / run / "SIMULATED.txt").exists()
    state = json.loads(
        (home / "checkpoints" / run / "step-1000" / "trainer_state.json").read_text()
    )
    assert state == {"step": 1000, "simulated": True}
    assert not (home / "adapters" / run / "adapter_model.safetensors").exists()  # no fake weights
    usage = PfsUsage.objects.get(team=newcomer.personal_team)
    assert usage.used_bytes > 0 and usage.files >= 4
    assert "0 字节" not in _part(html, "instance-pfs").replace("\xa0", " ")

    # The browser lists the adapter and downloads it.
    listing = client.get(adapter_url).content.decode()
    assert "adapter_config.json" in listing and "SIMULATED.txt" in listing
    download = client.get(
        reverse("slices:pfs-download"), {"path": f"adapters/{run}/adapter_config.json"}
    )
    assert download.status_code == 200
    assert json.loads(b"".join(download.streaming_content))["simulated"] is True

    # The demo page's runs table links the adapter to the browser as well.
    demo = client.get(URL).content.decode()
    assert f'href="{adapter_url}"' in demo


def test_while_starting_the_banner_is_in_the_live_card(
    world, newcomer, client: Client, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    client.force_login(newcomer)
    with django_capture_on_commit_callbacks(execute=False):  # nothing provisions
        response = client.post(URL, {"accept_license": "on"})
    instance = Instance.objects.get(created_by=newcomer)
    assert instance.state == InstanceState.PROVISIONING
    html = client.get(response["Location"]).content.decode()
    assert 'id="recipe-starting"' in html and "示例正在启动" in html
    messages_box = html.split('id="messages"', 1)[1].split("</div>", 1)[0]
    assert "示例正在启动" not in messages_box  # not a flash: it would outlive the run
    assert "自动释放" in _part(html, "instance-release-when")  # still ahead


def _log(instance: Instance, *events: dict) -> None:  # noqa: ANN401
    for event in events:
        InstanceEvent.objects.create(
            instance=instance,
            at=instance.created_at,
            kind=EventKind.LOG,
            step="run",
            text=json.dumps(event),
        )


def test_the_checkpoint_card_follows_the_recipe_when_the_pfs_is_behind(
    pfs, alice, alice_client
) -> None:  # noqa: ANN001
    instance = make_instance(
        alice, state="released", env={"RECIPE": "llama-lora", "RUN_NAME": "r1"}
    )
    Instance.objects.filter(pk=instance.pk).update(
        checkpoint={"run": "r1", "step": 200, "path": "/pfs/checkpoints/r1/step-200", "at": ""}
    )
    _log(
        instance,
        {"event": "start", "run": "r1", "max_steps": 1000},
        {"event": "checkpoint", "step": 200, "path": "/pfs/checkpoints/r1/step-200"},
        {"event": "checkpoint", "step": 400, "path": "/pfs/checkpoints/r1/step-400"},
    )
    html = alice_client.get(reverse("slices:instance-detail", args=[instance.public_id])).content
    html = html.decode()
    assert "400" in _part(html, "instance-checkpoint")
    assert 'href="/storage/pfs/?path=checkpoints%2Fr1%2Fstep-400"' in html
    # Ended without the adapter: the next step offers its checkpoints in the browser.
    assert 'id="recipe-checkpoints-link"' in html and "SSH" not in _part(html, "recipe-next")


def test_a_stored_later_checkpoint_wins_and_has_its_time(pfs, alice, alice_client) -> None:  # noqa: ANN001
    instance = make_instance(
        alice, env={"RECIPE": "llama-lora", "RUN_NAME": "r2", "CHECKPOINT_RUN": "r2"}
    )
    ckpt = pfs / storage.account_dir(alice) / "checkpoints" / "r2" / "step-600"
    ckpt.mkdir(parents=True)
    _log(instance, {"event": "checkpoint", "step": 400, "path": "/pfs/checkpoints/r2/step-400"})
    html = alice_client.get(reverse("slices:instance-detail", args=[instance.public_id])).content
    html = html.decode()
    assert "600" in _part(html, "instance-checkpoint")
    assert re.search(r"step-600</code> · \d{4}-\d\d-\d\d", html)


def test_the_simulated_files_are_written_once_and_never_through_a_link(tmp_path: Path) -> None:
    home = tmp_path / "acct"
    home.mkdir()
    lines = [
        json.dumps({"event": "checkpoint", "step": 200, "path": "/x", "simulated": True}),
        # Not marked simulated: a real run's line, whose files the recipe writes itself.
        json.dumps({"event": "checkpoint", "step": 300, "path": "/x"}),
        json.dumps({"event": "done", "step": 300, "adapter": "/pfs/adapters/r", "simulated": True}),
    ]
    env = {"RUN_NAME": "r", "LORA_R": "16", "MODEL_DIR": "/models/llama"}
    assert write_sim_recipe_files(home, env, lines) == [
        "/pfs/checkpoints/r/step-200",
        "/pfs/adapters/r",
    ]
    assert write_sim_recipe_files(home, env, lines) == []  # already there
    assert json.loads((home / "adapters" / "r" / "adapter_config.json").read_text())["r"] == 16
    assert not [p for p in (home / "checkpoints" / "r").iterdir() if p.name.startswith(".")]

    outside = tmp_path / "outside"
    outside.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "checkpoints").symlink_to(outside)
    (linked / "adapters").symlink_to(outside)
    assert write_sim_recipe_files(linked, env, lines) == []
    assert list(outside.iterdir()) == []
    for bad in ("../x", "a/b", "", ".hidden"):
        assert write_sim_recipe_files(home, {"RUN_NAME": bad}, lines) == []


def test_pfs_paths_become_browser_links() -> None:
    assert pfs_browse_url("/pfs/adapters/r") == "/storage/pfs/?path=adapters%2Fr"
    assert pfs_browse_url("/pfs") == "/storage/pfs/"
    assert pfs_browse_url("/etc/passwd") == ""
    assert pfs_browse_url("") == ""
