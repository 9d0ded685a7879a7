"""Search and filters over the whole shipped catalogue (loaded once for this module)."""

from __future__ import annotations

import pytest
from django.test import Client

from marketplace.models import Asset

pytestmark = pytest.mark.django_db


def test_the_marketplace_lists_every_shipped_model_and_dataset(
    full_catalogue, alice_client: Client
) -> None:
    models = alice_client.get("/api/v1/models/?limit=1").json()["count"]
    datasets = alice_client.get("/api/v1/datasets/?limit=1").json()["count"]
    assert models >= 300 and datasets >= 1100


def test_searching_llama_2_7b_finds_metas_model(full_catalogue, alice_client: Client) -> None:
    hits = alice_client.get("/api/v1/models/?q=llama 2 7b hf&publisher=meta-llama").json()[
        "results"
    ]
    # Best match first: the base model's name is the shortest that starts with the first word.
    assert [h["hub_id"] for h in hits] == [
        "meta-llama/Llama-2-7b-hf",
        "meta-llama/Llama-2-7b-chat-hf",
    ]
    assert all(h["gated"] and h["license"]["key"] == "llama2" for h in hits)


def test_best_match_puts_canonical_models_first(full_catalogue, alice_client: Client) -> None:
    def top(q: str, kind: str = "models") -> str:
        return alice_client.get(f"/api/v1/{kind}/?q={q}").json()["results"][0]["hub_id"]

    assert top("llama 2 7b") == "meta-llama/Llama-2-7b-hf"
    assert top("qwen 7b") == "Qwen/Qwen2-7B"
    assert top("google gemma").startswith("google/gemma-")
    assert top("squad", "datasets") == "squad"


def test_gated_filter_over_the_catalogue_returns_only_gated_licenses(
    full_catalogue, alice_client: Client
) -> None:
    body = alice_client.get("/api/v1/models/?gated=yes&limit=500").json()
    keys = {r["license"]["key"] for r in body["results"]}
    assert {"llama2", "gemma"} <= keys
    assert all(r["gated"] for r in body["results"])
    assert (
        body["count"]
        == Asset.objects.filter(kind="model", license__requires_acceptance=True).count()
    )


def test_largest_text_generation_models_first(full_catalogue, alice_client: Client) -> None:
    body = alice_client.get("/api/v1/models/?task=text-generation&sort=-params&limit=5").json()
    params = [r["params_billion"] for r in body["results"]]
    assert params == sorted(params, reverse=True) and params[0] >= 100


def test_datasets_filter_by_multi_valued_task_and_modality(
    full_catalogue, alice_client: Client
) -> None:
    body = alice_client.get("/api/v1/datasets/?task=token-classification&limit=500").json()
    assert body["count"] > 10
    assert all("token-classification" in r["tasks"] for r in body["results"])
    audio = alice_client.get("/api/v1/datasets/?modality=audio&limit=500").json()["results"]
    assert audio and all("audio" in r["modalities"] for r in audio)


def test_the_browse_page_over_the_whole_catalogue(full_catalogue, alice_client: Client) -> None:
    html = alice_client.get("/marketplace/?q=whisper&sort=-size").content.decode()
    assert "openai/whisper-large-v3" in html
    html = alice_client.get("/marketplace/datasets/?q=squad").content.decode()
    assert 'data-hub-id="squad"' in html
