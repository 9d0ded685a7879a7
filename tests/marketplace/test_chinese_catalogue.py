"""The Chinese model families and datasets over the whole shipped catalogue: they are loaded, their
Chinese names and descriptions are searchable, and with no query the most liked come first.

The ``check_*`` functions (``SEARCH_CHECKS``) hold the expectations; test_postgres_search.py runs the
same ones against PostgreSQL, so both databases give the same answers."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import Client

from marketplace import catalogue
from marketplace.models import Asset

pytestmark = pytest.mark.django_db

MODELS, DATASETS = "/api/v1/models/", "/api/v1/datasets/"
# The Chinese instruction and evaluation datasets the catalogue carries, with Chinese names.
CHINESE_DATASETS = (
    "shibing624/alpaca-zh",
    "BelleGroup/train_0.5M_CN",
    "YeungNLP/firefly-train-1.1M",
    "BAAI/COIG",
    "haonan-li/cmmlu",
    "ceval/ceval-exam",
)


def hub_ids(client: Client, url: str) -> list[str]:
    response = client.get(url)
    assert response.status_code == 200, response.content
    return [r["hub_id"] for r in response.json()["results"]]


def count(client: Client, url: str) -> int:
    return client.get(url).json()["count"]


def check_chinese_names_find_their_family_only(client: Client) -> None:
    total = Asset.objects.filter(kind="model").count()
    qwen = Asset.objects.filter(kind="model", hub_id__startswith="Qwen/").count()
    assert qwen > 20
    found = hub_ids(client, f"{MODELS}?q=通义千问&limit=500")
    assert len(found) == qwen < total
    assert all(h.startswith("Qwen/") for h in found)
    # Two characters: below the trigram length, still a real filter.
    assert set(hub_ids(client, f"{MODELS}?q=百川&limit=500")) == {
        "baichuan-inc/Baichuan2-7B-Base",
        "baichuan-inc/Baichuan2-7B-Chat",
        "baichuan-inc/Baichuan2-13B-Base",
        "baichuan-inc/Baichuan2-13B-Chat",
    }
    for query, publisher in (("书生·浦语", "internlm/"), ("书生浦语", "internlm/"),
                             ("零一万物", "01-ai/"), ("面壁", "openbmb/"),
                             ("深度求索", "deepseek-ai/"), ("智谱", "THUDM/")):  # fmt: skip
        found = hub_ids(client, f"{MODELS}?q={query}&limit=500")
        assert found and all(h.startswith(publisher) for h in found), query
    chinese = count(client, f"{MODELS}?q=中文")
    assert 0 < chinese < total


def check_mixed_queries_need_every_term(client: Client) -> None:
    found = hub_ids(client, f"{MODELS}?q=百川 13b&limit=50")
    assert set(found) == {"baichuan-inc/Baichuan2-13B-Base", "baichuan-inc/Baichuan2-13B-Chat"}
    qwen_7b = hub_ids(client, f"{MODELS}?q=通义千问 7b&limit=100")
    assert qwen_7b and all(h.startswith("Qwen/") and "7b" in h.lower() for h in qwen_7b)
    # Best match first: the name starting with the first term, shortest first, as in English.
    assert qwen_7b[0] == "Qwen/Qwen2-7B"
    for hub_id in hub_ids(client, f"{MODELS}?q=Qwen2 7B&limit=500"):
        assert "qwen2" in hub_id.lower() and "7b" in hub_id.lower()
    assert hub_ids(client, f"{MODELS}?q=百川 qwen") == []
    assert hub_ids(client, f"{MODELS}?q=deepseek v2 lite&limit=5")[0] == (
        "deepseek-ai/DeepSeek-V2-Lite"
    )


def check_chinese_datasets_are_searchable(client: Client) -> None:
    chinese = set(hub_ids(client, f"{DATASETS}?q=中文&limit=500"))
    assert set(CHINESE_DATASETS) <= chinese
    assert len(chinese) < Asset.objects.filter(kind="dataset").count()
    assert hub_ids(client, f"{DATASETS}?q=流萤") == ["YeungNLP/firefly-train-1.1M"]
    assert set(hub_ids(client, f"{DATASETS}?q=指令 belle")) == {
        "BelleGroup/train_0.5M_CN",
        "BelleGroup/train_1M_CN",
    }


def check_no_query_lists_the_most_liked_first(client: Client) -> None:
    results = client.get(f"{MODELS}?limit=100").json()["results"]
    most_liked = Asset.objects.filter(kind="model", likes__isnull=False).order_by("-likes")[0]
    assert results[0]["hub_id"] == most_liked.hub_id
    likes = [r["likes"] for r in results]
    assert all(n is not None for n in likes) and likes == sorted(likes, reverse=True)


def test_the_extra_rows_and_likes_are_loaded(full_catalogue) -> None:
    shipped = len(catalogue.read_catalogue(catalogue.MODEL))
    assert Asset.objects.filter(kind="model").count() == shipped > 1698
    glm = Asset.objects.get(kind="model", hub_id="THUDM/glm-4-9b-chat")
    assert (glm.params_billion, glm.likes, glm.license.key) == (9.0, 663, "other")
    assert glm.name_zh == "智谱 glm-4-9b-chat" and "智谱 AI" in glm.description_zh
    assert (
        glm.source.startswith("hlzhang109/causal-eval:") and "THUDM/GLM-4:README.md@" in glm.source
    )
    qwen = Asset.objects.get(kind="model", hub_id="Qwen/Qwen2.5-7B-Instruct")
    assert (qwen.name_zh, qwen.likes) == ("通义千问 Qwen2.5-7B-Instruct", 470)
    ceval = Asset.objects.get(kind="dataset", hub_id="ceval/ceval-exam")
    assert ceval.name_zh.startswith("C-Eval") and "13948" in ceval.description_zh


SEARCH_CHECKS = (
    check_chinese_names_find_their_family_only,
    check_mixed_queries_need_every_term,
    check_chinese_datasets_are_searchable,
    check_no_query_lists_the_most_liked_first,
)


def check_name(check: Callable[[Client], None]) -> str:
    return check.__name__.removeprefix("check_")


@pytest.mark.parametrize("check", SEARCH_CHECKS, ids=check_name)
def test_search(check: Callable[[Client], None], full_catalogue, alice_client: Client) -> None:
    check(alice_client)


def test_the_browse_page_shows_the_chinese_name(full_catalogue, alice_client: Client) -> None:
    html = alice_client.get("/marketplace/?q=百川").content.decode()
    assert 'data-hub-id="baichuan-inc/Baichuan2-7B-Chat"' in html
    assert "百川 Baichuan2-7B-Chat" in html
