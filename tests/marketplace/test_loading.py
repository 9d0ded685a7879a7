"""Loading the shipped catalogue: counts, derived values, idempotency, operator edits kept."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from marketplace import services
from marketplace.models import Asset, Image, ImageVersion, License

pytestmark = pytest.mark.django_db


def test_loading_twice_changes_nothing_the_second_time() -> None:
    first = services.load_catalogue()
    assert first.created["models"] >= 300
    assert first.created["datasets"] >= 1100
    ids = dict(Asset.objects.values_list("hub_id", "public_id"))
    counts = (Asset.objects.count(), License.objects.count(), ImageVersion.objects.count())

    second = services.load_catalogue()

    assert second.created == {}
    assert second.updated == {}
    assert second.unchanged["models"] == first.created["models"]
    assert second.unchanged["datasets"] == first.created["datasets"]
    assert (Asset.objects.count(), License.objects.count(), ImageVersion.objects.count()) == counts
    assert dict(Asset.objects.values_list("hub_id", "public_id")) == ids  # links stay valid


def test_reloading_restores_facts_but_keeps_operator_choices() -> None:
    services.load_catalogue()
    llama = Asset.objects.get(hub_id="meta-llama/Llama-2-7b-hf")
    llama.name = "edited by mistake"
    llama.is_listed = False
    llama.save()
    apache = License.objects.get(key="apache-2.0")
    apache.requires_acceptance = True  # an operator gates it in the admin
    apache.save()
    gemma = License.objects.get(key="gemma")
    gemma.requires_acceptance = False  # an operator un-gates it
    gemma.save()

    report = services.load_catalogue()

    llama.refresh_from_db()
    assert llama.name == "Llama-2-7b-hf"
    assert llama.is_listed is False
    assert report.updated["models"] == 1
    assert License.objects.get(key="apache-2.0").requires_acceptance is True
    # Fail safe: licenses.yaml gates gemma, so a reload gates it again.
    assert License.objects.get(key="gemma").requires_acceptance is True


def test_loading_derives_slug_estimated_size_and_gated_license() -> None:
    services.load_catalogue()
    llama = Asset.objects.select_related("license").get(hub_id="meta-llama/Llama-2-7b-hf")
    assert llama.slug == "meta-llama--llama-2-7b-hf"
    assert llama.size_estimated is True
    assert llama.size_gb == pytest.approx(13.476)
    assert llama.license.key == "llama2"
    assert llama.gated is True
    assert llama.mount_point == "/models/meta-llama--llama-2-7b-hf"
    squad = Asset.objects.select_related("license").get(kind="dataset", hub_id="squad")
    assert squad.gated is False
    assert squad.size_estimated is False
    assert squad.source.startswith("huggingface/datasets:datasets/squad/")


def test_loading_creates_the_four_image_families_with_versions() -> None:
    services.load_catalogue()
    frameworks = set(Image.objects.values_list("framework", flat=True))
    assert {"PyTorch", "DeepSpeed", "Megatron-LM", "Colossal-AI"} <= frameworks
    for image in Image.objects.exclude(slug="ai-apps"):
        assert image.versions.count() >= 3
    # The AI applications' image (issue 20): one version, what the apps' manifests name.
    apps = Image.objects.get(slug="ai-apps")
    assert list(apps.versions.values_list("slug", flat=True)) == [
        "ai-apps-2026.11-torch2.4.0-cuda12.1"
    ]
    version = ImageVersion.objects.get(slug="pytorch-2.1.2-cuda12.1-py3.10")
    assert version.container == "pytorch/pytorch:2.1.2-cuda12.1-cudnn8-devel"
    assert {"name": "JupyterLab", "port": 8888, "protocol": "http"} in version.ports


def test_the_management_command_prints_what_it_did() -> None:
    # The shared catalogue's 1,698 models and 1,501 datasets, plus the added Chinese families
    # (models_extra.csv: 38) and datasets (datasets_extra.csv: 5).
    out = StringIO()
    call_command("load_catalogue", stdout=out)
    assert "models: 1736 created" in out.getvalue()
    assert "datasets: 1506 created" in out.getvalue()
    out = StringIO()
    call_command("load_catalogue", stdout=out)
    assert "models: 0 created, 0 updated, 1736 unchanged" in out.getvalue()


def test_loading_merges_likes_and_chinese_names_and_names_every_source() -> None:
    services.load_catalogue()
    yi = Asset.objects.get(kind="model", hub_id="01-ai/Yi-34B")
    assert yi.likes == 1291  # "Hub ❤️" in the leaderboard export the row comes from
    assert yi.name_zh == "零一万物 Yi-34B"
    assert yi.source.split(" + ") == [
        "hlzhang109/causal-eval:data/open_llm_leaderboard.csv@ca2a96b",
        "01-ai/Yi:README.md@002dde9",
        "deepseek-ai/DeepSeek-V2:README.md@07245db",
    ]
    # The search document holds the Chinese name and description.
    assert "零一万物" in yi.search_document and "llama" in yi.search_document
    # A source without likes leaves them unknown rather than zero.
    chatglm = Asset.objects.get(kind="model", hub_id="THUDM/chatglm3-6b")
    assert chatglm.likes is None and chatglm.params_billion is None
    assert chatglm.source == "THUDM/ChatGLM3:README.md@03ccc15"


def test_an_asset_added_by_an_operator_survives_a_reload() -> None:
    from tests.marketplace.factories import AssetFactory

    own = AssetFactory(hub_id="acme/in-house-model")
    services.load_catalogue()
    assert Asset.objects.filter(pk=own.pk, is_listed=True).exists()
