"""Search, every filter and every sort, through the browse page and the API (same parameters)."""

from __future__ import annotations

import html
import re

import pytest
from django.test import Client

from marketplace.choices import AssetKind
from tests.marketplace.factories import AssetFactory, LicenseFactory

pytestmark = pytest.mark.django_db

HUB_ID = re.compile(r'data-hub-id="([^"]+)"')
LIST = {AssetKind.MODEL: "/marketplace/", AssetKind.DATASET: "/marketplace/datasets/"}
API = {AssetKind.MODEL: "/api/v1/models/", AssetKind.DATASET: "/api/v1/datasets/"}


@pytest.fixture
def shelf() -> None:
    llama2 = LicenseFactory(
        key="llama2", name="Llama 2 Community License", requires_acceptance=True
    )
    mit = LicenseFactory(key="mit", name="MIT License")
    AssetFactory(
        hub_id="meta-llama/Llama-2-7b-hf",
        publisher="meta-llama",
        params_billion=6.738,
        size_gb=13.476,
        license=llama2,
    )
    AssetFactory(
        hub_id="meta-llama/Llama-2-70b-hf",
        publisher="meta-llama",
        params_billion=68.98,
        size_gb=137.96,
        license=llama2,
    )
    AssetFactory(
        hub_id="openai/whisper-large-v3",
        publisher="openai",
        task="automatic-speech-recognition",
        modalities="text,audio",
        params_billion=1.55,
        size_gb=3.1,
        license=mit,
    )
    AssetFactory(
        hub_id="BAAI/bge-m3",
        publisher="BAAI",
        task="embedding",
        params_billion=0.568,
        size_gb=None,
        license=None,
    )
    AssetFactory(
        kind=AssetKind.DATASET,
        hub_id="squad",
        publisher="",
        task="question-answering",
        params_billion=None,
        size_gb=0.12,
        license=mit,
    )
    AssetFactory(
        kind=AssetKind.DATASET,
        hub_id="ade_corpus_v2",
        publisher="",
        tasks="text-classification;token-classification",
        params_billion=None,
        size_gb=0.007,
        license=None,
    )


def page_ids(client: Client, kind: str, query: str) -> list[str]:
    """The hub ids in the htmx results fragment, in order."""
    response = client.get(f"{LIST[kind]}?{query}", headers={"HX-Request": "true"})
    assert response.status_code == 200
    return [html.unescape(h) for h in HUB_ID.findall(response.content.decode())]


def api_ids(client: Client, kind: str, query: str) -> list[str]:
    response = client.get(f"{API[kind]}?{query}")
    assert response.status_code == 200, response.content
    return [r["hub_id"] for r in response.json()["results"]]


def both(client: Client, query: str, kind: str = AssetKind.MODEL) -> list[str]:
    from_page = page_ids(client, kind, query)
    assert api_ids(client, kind, query) == from_page, query
    return from_page


LLAMA7, LLAMA70 = "meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf"
WHISPER, BGE = "openai/whisper-large-v3", "BAAI/bge-m3"


def test_search_matches_every_word_case_insensitively(shelf, alice_client: Client) -> None:
    assert both(alice_client, "q=LLAMA 7b") == [LLAMA7]
    assert both(alice_client, "q=llama&sort=name") == [LLAMA70, LLAMA7]
    assert both(alice_client, "q=whisper") == [WHISPER]
    assert both(alice_client, "q=llama whisper") == []


def test_a_search_lists_best_matches_first_unless_sorted(shelf, alice_client: Client) -> None:
    AssetFactory(hub_id="acme/My-Llama-Finetune", publisher="acme")
    # Names starting with the first word, shortest first; then the rest.
    assert both(alice_client, "q=llama") == [LLAMA7, LLAMA70, "acme/My-Llama-Finetune"]
    assert both(alice_client, "q=llama&sort=relevance") == both(alice_client, "q=llama")
    # A publisher named in the query counts too.
    assert both(alice_client, "q=acme llama")[0] == "acme/My-Llama-Finetune"
    # Without a search, "best match" is the name order.
    assert both(alice_client, "sort=relevance") == both(alice_client, "sort=name")


def test_search_finds_by_publisher_and_task_words(shelf, alice_client: Client) -> None:
    assert both(alice_client, "q=openai") == [WHISPER]
    assert both(alice_client, "q=speech") == [WHISPER]
    assert both(alice_client, "q=squad", AssetKind.DATASET) == ["squad"]


def test_search_ignores_punctuation_and_never_errors(shelf, alice_client: Client) -> None:
    assert both(alice_client, "q=llama-2/7b") == [LLAMA7]
    # Nothing searchable left: no search filter, everything listed (by name).
    assert both(alice_client, "q=%27%22%25_") == [BGE, LLAMA70, LLAMA7, WHISPER]


def test_filter_by_task(shelf, alice_client: Client) -> None:
    assert both(alice_client, "task=embedding") == [BGE]
    assert both(alice_client, "task=token-classification", AssetKind.DATASET) == ["ade_corpus_v2"]
    # A task must match whole, not as a substring of another.
    assert both(alice_client, "task=classification", AssetKind.DATASET) == []


def test_filter_by_modality(shelf, alice_client: Client) -> None:
    assert both(alice_client, "modality=audio") == [WHISPER]
    assert len(both(alice_client, "modality=text")) == 4


def test_filter_by_publisher(shelf, alice_client: Client) -> None:
    assert both(alice_client, "publisher=META-LLAMA") == [LLAMA70, LLAMA7]


def test_filter_by_license(shelf, alice_client: Client) -> None:
    assert both(alice_client, "license=mit") == [WHISPER]
    assert both(alice_client, "license=llama2") == [LLAMA70, LLAMA7]


def test_filter_by_size_range(shelf, alice_client: Client) -> None:
    assert both(alice_client, "size_min=10&size_max=100") == [LLAMA7]
    assert both(alice_client, "size_min=100") == [LLAMA70]
    # Unknown sizes never match a size range.
    assert BGE not in both(alice_client, "size_max=1000")


def test_filter_by_parameter_range(shelf, alice_client: Client) -> None:
    assert both(alice_client, "params_min=1&params_max=7") == [LLAMA7, WHISPER]


def test_filter_by_gated(shelf, alice_client: Client) -> None:
    assert both(alice_client, "gated=yes") == [LLAMA70, LLAMA7]
    # Open includes assets whose source names no license.
    assert both(alice_client, "gated=no&sort=name") == [BGE, WHISPER]


def test_sort_by_name_size_and_parameters(shelf, alice_client: Client) -> None:
    assert both(alice_client, "sort=name") == [BGE, LLAMA70, LLAMA7, WHISPER]
    assert both(alice_client, "sort=-name") == [WHISPER, LLAMA7, LLAMA70, BGE]
    # Unknown sizes sort last both ways.
    assert both(alice_client, "sort=size") == [WHISPER, LLAMA7, LLAMA70, BGE]
    assert both(alice_client, "sort=-size") == [LLAMA70, LLAMA7, WHISPER, BGE]
    assert both(alice_client, "sort=params") == [BGE, WHISPER, LLAMA7, LLAMA70]
    assert both(alice_client, "sort=-params") == [LLAMA70, LLAMA7, WHISPER, BGE]


def test_filters_combine(shelf, alice_client: Client) -> None:
    assert both(alice_client, "q=llama&gated=yes&size_max=50&sort=-params") == [LLAMA7]


def test_a_bad_filter_is_reported_and_ignored_on_the_page(shelf, alice_client: Client) -> None:
    response = alice_client.get("/marketplace/?size_min=lots&publisher=openai")
    assert response.status_code == 200
    assert HUB_ID.findall(response.content.decode()) == [WHISPER]
    assert "size_min" in response.content.decode()


def test_a_bad_filter_is_a_400_with_the_error_body_in_the_api(shelf, alice_client: Client) -> None:
    response = alice_client.get("/api/v1/models/?size_min=10&size_max=1")
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid"
    assert "size_max" in body["fields"]
    assert alice_client.get("/api/v1/models/?sort=random").status_code == 400


def test_unlisted_assets_are_not_shown(shelf, alice_client: Client) -> None:
    from marketplace.models import Asset

    Asset.objects.filter(hub_id=LLAMA70).update(is_listed=False)
    assert both(alice_client, "q=llama") == [LLAMA7]
    assert alice_client.get("/marketplace/models/meta-llama--llama-2-70b-hf/").status_code == 404
    assert alice_client.get("/api/v1/models/meta-llama--llama-2-70b-hf/").status_code == 404
