"""What a search query means (issue 21), without the shipped catalogue: kind words, task and
language words in Chinese and English, Chinese without spaces, sizes and numbers on number
boundaries, the marks in the search document and the migration that adds them to stored rows.
test_search_queries.py runs real queries over the whole catalogue."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps as django_apps
from django.test import Client

from marketplace import catalogue
from marketplace.catalogue import DATASET, MODEL, parse_query
from marketplace.models import Asset
from tests.marketplace.factories import AssetFactory
from tests.marketplace.test_filters import both


# --- the query, understood (no database) ---------------------------------------------------------
def clause_texts(q: str) -> list[tuple[str, str]]:
    return [(c.text, c.role) for c in parse_query(q).clauses]


def test_kind_words_filter_instead_of_matching_text() -> None:
    for q in ("中文 对话 数据集", "中文对话数据集", "chinese chat dataset", "chinese chat data"):
        query = parse_query(q)
        assert query.kind == DATASET, q
        assert [c.role for c in query.clauses] == ["concept", "concept"], q
    assert parse_query("qwen 模型").kind == MODEL
    assert parse_query("中文 大模型").kind == MODEL  # a kind and the text-generation task
    assert parse_query("模型 数据集").kind == ""  # both kinds named: neither
    assert parse_query("数据集").clauses == ()


def test_chinese_runs_are_cut_at_known_words_and_names_stay_whole() -> None:
    assert clause_texts("找一个中文的对话数据集") == [("中文", "concept"), ("对话", "concept")]
    assert clause_texts("通义千问 7b") == [("通义千问", "word"), ("7b", "size")]
    assert clause_texts("书生·浦语") == [("书生浦语", "word")]
    assert clause_texts("流萤") == [("流萤", "word")]


def test_task_words_in_both_languages_mean_the_same_concept() -> None:
    same = [
        ("对话", "chat", "dialogue", "conversation"),
        ("中文", "chinese", "zh"),
        ("指令", "instruction", "sft"),
        ("代码", "code", "programming"),
        ("数学", "math"),
        ("图像", "image", "vision"),
        ("语音", "speech", "audio"),
        ("多模态", "multimodal", "multi-modal"),
        ("微调", "fine-tune", "finetuning"),
        ("翻译", "translation"),
        ("摘要", "summarization", "summary"),
    ]
    for words in same:
        patterns = {parse_query(w).clauses[0].patterns for w in words}
        assert len(patterns) == 1, words


def test_sizes_and_numbers_are_cut_on_number_boundaries() -> None:
    assert clause_texts("llama 2 7b") == [("llama", "word"), ("2", "number"), ("7b", "size")]
    assert clause_texts("1.5B") == [("1.5b", "size")]
    # Chinese writes parameter counts in 10^8 ("亿"): 70亿 is 7B, 15亿 is 1.5B.
    assert clause_texts("70亿 对话") == [("7b", "size"), ("对话", "concept")]
    assert clause_texts("15亿") == [("1.5b", "size")]

    def document(hub_id: str) -> str:
        return catalogue.asset_search_document(
            hub_id=hub_id,
            name=hub_id.split("/")[-1],
            name_zh="",
            publisher=hub_id.split("/")[0],
            tasks=["text-generation"],
            modalities=["text"],
            description="Available in 7B and 13B.",
            description_zh="",
        )

    seven = parse_query("7b")
    assert seven.matches(document("Qwen/Qwen2-7B"))
    assert seven.matches(document("meta-llama/Llama-2-7b-chat-hf"))
    assert seven.matches(document("acme/llama7b"))  # glued to a name, still a size
    assert not seven.matches(document("Qwen/Qwen1.5-57B"))
    assert not seven.matches(document("Qwen/Qwen3-1.7B"))
    assert not seven.matches(document("mistralai/Mixtral-8x7B-v0.1"))  # 8 experts of 7B: 47B
    assert not parse_query("13b").matches(document("Qwen/Qwen2-7B"))  # the description's 13B
    assert parse_query("1.5b").matches(document("Qwen/Qwen2.5-1.5B"))
    assert not parse_query("1.5b").matches(document("Qwen/Qwen2.5-0.5B"))
    assert parse_query("llama 3").matches(document("meta-llama/Llama-3.1-8B"))
    assert not parse_query("llama 3").matches(document("meta-llama/Llama-2-13b-hf"))


def test_the_document_carries_the_facets_and_the_language() -> None:
    doc = catalogue.asset_search_document(
        hub_id="lccc",
        name="LCCC: Large-scale Cleaned Chinese Conversation corpus",
        name_zh="",
        publisher="",
        tasks=["conversational"],
        modalities=["text"],
        description="",
        description_zh="",
    )
    assert " §t:conversational " in doc and " §m:text " in doc and " §l:zh " in doc
    english = catalogue.asset_search_document(
        hub_id="squad",
        name="SQuAD",
        name_zh="",
        publisher="",
        tasks=["question-answering"],
        modalities=["text", "image"],
        description="Questions on Wikipedia articles.",
        description_zh="",
    )
    assert " §l:zh " not in english and " §m:multi " in english


# --- a small shelf: sizes on number boundaries, and the stored documents --------------------------
@pytest.fixture
def sized(db) -> None:
    for hub_id in (
        "Qwen/Qwen2-7B",
        "meta-llama/Llama-2-7b-chat-hf",
        "Qwen/Qwen1.5-57B",
        "Qwen/Qwen3-1.7B",
        "Qwen/Qwen2.5-1.5B",
    ):
        AssetFactory(hub_id=hub_id, publisher=hub_id.split("/")[0])


@pytest.mark.django_db
def test_7b_matches_7b_and_7b_chat_not_57b_or_1_7b(sized, alice_client: Client) -> None:
    assert set(both(alice_client, "q=7b")) == {"Qwen/Qwen2-7B", "meta-llama/Llama-2-7b-chat-hf"}
    assert both(alice_client, "q=1.5b") == ["Qwen/Qwen2.5-1.5B"]
    assert both(alice_client, "q=1.7B") == ["Qwen/Qwen3-1.7B"]
    assert both(alice_client, "q=57b") == ["Qwen/Qwen1.5-57B"]
    assert both(alice_client, "q=qwen 7b") == ["Qwen/Qwen2-7B"]


@pytest.mark.django_db
def test_the_migration_rebuilds_the_stored_documents(sized) -> None:
    """Documents stored before issue 21 lack the marks; migration 0006 rebuilds them as the
    model does, so "7b" finds existing rows after an upgrade without a catalogue reload."""
    Asset.objects.update(search_document=" qwen qwen2 7b ")
    migration = importlib.import_module("marketplace.migrations.0006_asset_search_marks")
    migration.rebuild_documents(django_apps, None)
    for asset in Asset.objects.all():
        assert asset.search_document == asset.build_search_document()
    assert {a.hub_id for a in Asset.objects.search("7b")} == {
        "Qwen/Qwen2-7B",
        "meta-llama/Llama-2-7b-chat-hf",
    }
