"""The files that add the Chinese families, the likes and the Chinese names (pure: no database)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from marketplace import catalogue
from marketplace.catalogue import DATASET, MODEL, CatalogueError
from tests.marketplace.test_chinese_catalogue import CHINESE_DATASETS

# owner/repo:path@commit, several joined by " + ": the form every shipped row's source takes.
SOURCE = re.compile(r"^[\w.-]+/[\w.-]+:[^@\s]+@[0-9a-f]{7,40}$")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("path", [catalogue.MODELS_EXTRA_CSV, catalogue.DATASETS_EXTRA_CSV])
def test_every_added_row_names_a_source_at_a_commit(path: Path) -> None:
    rows = _rows(path)
    assert rows
    for row in rows:
        assert SOURCE.fullmatch(row["source"]), row
        assert row["publisher"] == row["hub_id"].split("/")[0]


def test_the_families_chinese_users_look_for_are_shipped_with_chinese_names() -> None:
    models = {r.hub_id: r for r in catalogue.read_catalogue(MODEL)}
    for hub_id, name_zh in {
        "THUDM/chatglm3-6b": "智谱 chatglm3-6b",
        "THUDM/glm-4-9b-chat": "智谱 glm-4-9b-chat",
        "baichuan-inc/Baichuan2-13B-Chat": "百川 Baichuan2-13B-Chat",
        "internlm/internlm2-chat-7b": "书生·浦语 internlm2-chat-7b",
        "internlm/internlm2_5-7b-chat": "书生·浦语 internlm2_5-7b-chat",
        "01-ai/Yi-34B-Chat": "零一万物 Yi-34B-Chat",
        "openbmb/MiniCPM-2B-sft-bf16": "面壁 MiniCPM-2B-sft-bf16",
        "Qwen/Qwen2.5-72B-Instruct": "通义千问 Qwen2.5-72B-Instruct",
        "deepseek-ai/deepseek-llm-7b-chat": "深度求索 deepseek-llm-7b-chat",
        "deepseek-ai/DeepSeek-V2-Lite": "深度求索 DeepSeek-V2-Lite",
    }.items():
        record = models[hub_id]
        assert record.name_zh == name_zh
        assert record.description and record.description_zh, hub_id
    datasets = {r.hub_id: r for r in catalogue.read_catalogue(DATASET)}
    for hub_id in CHINESE_DATASETS:
        assert datasets[hub_id].name_zh and datasets[hub_id].description_zh, hub_id


def test_a_number_the_source_does_not_give_stays_empty() -> None:
    models = {r.hub_id: r for r in catalogue.read_catalogue(MODEL)}
    # The ChatGLM3 README states no parameter count: no size either, rather than a guess.
    assert models["THUDM/chatglm3-6b"].params_billion is None
    assert models["THUDM/chatglm3-6b"].size_gb is None
    assert models["THUDM/chatglm3-6b"].likes is None
    assert models["deepseek-ai/DeepSeek-V2-Lite"].params_billion == 16


def test_every_description_entry_and_every_like_names_a_shipped_asset() -> None:
    shipped = {
        (kind, r.hub_id.lower())
        for kind in (MODEL, DATASET)
        for r in catalogue.read_catalogue(kind)
    }
    for entry in catalogue.read_descriptions():
        assert any(entry.matches(kind, hub) for kind, hub in shipped), entry.match
        assert SOURCE.fullmatch(entry.source.split(" + ")[0]), entry.source
    for (kind, hub_id), likes in catalogue.read_likes().items():
        assert (kind, hub_id.lower()) in shipped and likes.likes >= 0
        assert SOURCE.fullmatch(likes.source)


def test_a_hub_id_in_both_files_is_refused(tmp_path: Path) -> None:
    header = "hub_id,name,publisher,task,modality,params_billion,size_gb,license,source\n"
    row = "org/m,m,org,text-generation,text,1,,mit,o/r:README.md@abc1234\n"
    base, extra = tmp_path / "models.csv", tmp_path / "extra.csv"
    base.write_text(header + row, encoding="utf-8")
    extra.write_text(header + row.replace("org/m,", "ORG/M,"), encoding="utf-8")
    with pytest.raises(CatalogueError, match="already in models.csv"):
        catalogue.read_catalogue(MODEL, base, extra, tmp_path / "none.csv", tmp_path / "none.yaml")


def test_the_first_matching_description_wins_and_sources_are_joined(tmp_path: Path) -> None:
    header = "hub_id,name,publisher,task,modality,params_billion,size_gb,license,source\n"
    base = tmp_path / "models.csv"
    base.write_text(
        header
        + "org/m-chat,m-chat,org,text-generation,text,1,,mit,a/b:x.csv@1111111\n"
        + "org/m-base,m-base,org,text-generation,text,1,,mit,a/b:x.csv@1111111\n",
        encoding="utf-8",
    )
    likes = tmp_path / "likes.csv"
    likes.write_text("kind,hub_id,likes,source\nmodel,org/m-chat,12,a/b:x.csv@1111111\n")
    described = tmp_path / "descriptions.yaml"
    described.write_text(
        "- {kind: model, match: ['ORG/*-chat'], name_zh: '对话 {name}', source: 'c/d:R.md@2222222'}\n"
        "- {kind: model, match: ['org/*'], name_zh: '全部 {name}', source: 'e/f:R.md@3333333'}\n",
        encoding="utf-8",
    )
    chat, base_model = catalogue.read_catalogue(
        MODEL, base, tmp_path / "none.csv", likes, described
    )
    assert (chat.name_zh, chat.likes) == ("对话 m-chat", 12)
    assert chat.source == "a/b:x.csv@1111111 + c/d:R.md@2222222"
    assert (base_model.name_zh, base_model.likes) == ("全部 m-base", None)


def test_likes_must_be_whole_numbers(tmp_path: Path) -> None:
    likes = tmp_path / "likes.csv"
    likes.write_text("kind,hub_id,likes,source\nmodel,org/m,1.5,a/b:x.csv@1111111\n")
    with pytest.raises(CatalogueError, match="likes.csv:2"):
        catalogue.read_likes(likes)
