"""Searching in Chinese, and mixed Chinese and English, on the browse page and the API (SQLite here;
tests/marketplace/test_postgres_search.py asks PostgreSQL the same questions)."""

from __future__ import annotations

import pytest
from django.test import Client

from marketplace import catalogue
from marketplace.choices import AssetKind
from marketplace.models import Asset
from tests.marketplace.factories import AssetFactory
from tests.marketplace.test_filters import api_ids, both

pytestmark = pytest.mark.django_db

QWEN7 = "Qwen/Qwen2.5-7B-Instruct"
QWEN72 = "Qwen/Qwen2.5-72B-Instruct"
BAICHUAN = "baichuan-inc/Baichuan2-7B-Chat"
INTERN = "internlm/internlm2_5-7b-chat"
LLAMA = "meta-llama/Llama-2-7b-hf"
ALPACA_ZH = "shibing624/alpaca-zh"


@pytest.fixture
def shelf() -> None:
    AssetFactory(
        hub_id=QWEN7,
        publisher="Qwen",
        name_zh="通义千问 Qwen2.5-7B-Instruct",
        description="Qwen2.5, Alibaba Cloud's open LLMs; Chinese, English and 27 more languages.",
        description_zh="阿里云通义千问开源大模型，支持中文、英文等 29 种以上语言。",
        likes=470,
    )
    AssetFactory(
        hub_id=QWEN72,
        publisher="Qwen",
        name_zh="通义千问 Qwen2.5-72B-Instruct",
        description_zh="阿里云通义千问开源大模型，支持中文、英文等 29 种以上语言。",
        likes=721,
    )
    AssetFactory(
        hub_id=BAICHUAN,
        publisher="baichuan-inc",
        name_zh="百川 Baichuan2-7B-Chat",
        description_zh="百川智能开源的中文、英文双语大模型。",
    )
    AssetFactory(
        hub_id=INTERN,
        publisher="internlm",
        name_zh="书生·浦语 internlm2_5-7b-chat",
        likes=188,
    )
    AssetFactory(hub_id=LLAMA, publisher="meta-llama", likes=2000)
    AssetFactory(
        kind=AssetKind.DATASET,
        hub_id=ALPACA_ZH,
        publisher="shibing624",
        name_zh="Alpaca 中文指令数据",
        description_zh="Alpaca 指令数据的中文译本。",
        params_billion=None,
    )


def test_the_search_terms_keep_chinese_and_split_it_from_english() -> None:
    assert catalogue.search_terms("Qwen2.5-7B 通义千问") == ["qwen2", "5", "7b", "通义千问"]
    assert catalogue.search_terms("qwen中文") == ["qwen", "中文"]
    # Full-width letters fold to ASCII; the middle dot joins a Chinese name instead of cutting it.
    assert catalogue.search_terms("Ｑｗｅｎ 书生·浦语") == ["qwen", "书生浦语"]
    assert catalogue.query_terms("，。！ ") == []


def test_a_chinese_name_finds_its_models_only(shelf, alice_client: Client) -> None:
    assert set(both(alice_client, "q=通义千问")) == {QWEN7, QWEN72}
    # Part of a name is enough: Chinese has no spaces to cut words at.
    assert set(both(alice_client, "q=千问")) == {QWEN7, QWEN72}
    assert both(alice_client, "q=书生浦语") == both(alice_client, "q=书生·浦语") == [INTERN]


def test_two_character_chinese_terms_match(shelf, alice_client: Client) -> None:
    # Under three characters there is no trigram; the term still has to match.
    assert both(alice_client, "q=百川") == [BAICHUAN]
    # "中文" is the language (issue 21): every asset with Chinese text, 书生·浦语 too; not Llama.
    assert set(both(alice_client, "q=中文")) == {QWEN7, QWEN72, BAICHUAN, INTERN}
    assert api_ids(alice_client, AssetKind.DATASET, "q=中文") == [ALPACA_ZH]


def test_mixed_queries_need_every_term(shelf, alice_client: Client) -> None:
    assert both(alice_client, "q=qwen 中文") == [QWEN7, QWEN72]
    assert both(alice_client, "q=通义千问 72b") == [QWEN72]
    assert both(alice_client, "q=百川 qwen") == []
    assert both(alice_client, "q=Qwen2.5 7B") == [QWEN7]


def test_the_descriptions_in_both_languages_are_searched(shelf, alice_client: Client) -> None:
    assert both(alice_client, "q=阿里云") == [QWEN7, QWEN72]
    assert both(alice_client, "q=alibaba") == [QWEN7]


def test_a_chinese_query_ranks_names_that_start_with_it_first(shelf, alice_client: Client) -> None:
    # Both names start with the term: the shorter first, as for English queries.
    assert both(alice_client, "q=通义千问") == [QWEN7, QWEN72]


def test_without_a_query_the_most_liked_come_first(shelf, alice_client: Client) -> None:
    # Likes where the source gives them, most first; the others after, by name.
    assert both(alice_client, "") == [LLAMA, QWEN72, QWEN7, INTERN, BAICHUAN]
    assert both(alice_client, "sort=popular") == both(alice_client, "")
    # The list says why: the likes beside the size.
    html = alice_client.get("/marketplace/", headers={"HX-Request": "true"}).content.decode()
    assert 'data-likes="2000"' in html and "♥ 470" in html


def test_the_chinese_name_and_description_show_in_the_chinese_ui_only(
    shelf, alice_client: Client
) -> None:
    asset = Asset.objects.get(hub_id=QWEN7)
    zh = alice_client.get(asset.get_absolute_url(), headers={"Accept-Language": "zh-hans"})
    assert "通义千问 Qwen2.5-7B-Instruct" in zh.content.decode()
    assert "阿里云通义千问开源大模型" in zh.content.decode()
    alice_client.cookies["django_language"] = "en"
    en = alice_client.get(asset.get_absolute_url(), headers={"Accept-Language": "en"}).content
    assert "通义千问" not in en.decode()
    assert "Alibaba Cloud&#x27;s open LLMs" in en.decode()
