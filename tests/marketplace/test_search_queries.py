"""Search that finds what people mean (issue 21), over the whole shipped catalogue: the real
queries of search_queries.py through the API and the browse page, the issue's own examples, sizes
on number boundaries and a kind word that moves the search to the other list
(test_postgres_search_queries.py asks PostgreSQL the same; test_search_understanding.py holds
the parser's own tests)."""

from __future__ import annotations

import html
import re

import pytest
from django.test import Client

from marketplace.catalogue import DATASET, MODEL
from marketplace.models import Asset
from tests.marketplace.search_queries import CASES, TOP, Case, Row

API = {MODEL: "/api/v1/models/", DATASET: "/api/v1/datasets/"}
LIST = {MODEL: "/marketplace/", DATASET: "/marketplace/datasets/"}
HUB_ID = re.compile(r'data-hub-id="([^"]+)"')


def top_rows(client: Client, case: Case) -> list[Row]:
    response = client.get(API[case.kind], {"q": case.query, "limit": TOP})
    assert response.status_code == 200, response.content
    hub_ids = [r["hub_id"] for r in response.json()["results"]]
    found = {a.hub_id: a for a in Asset.objects.filter(kind=case.kind, hub_id__in=hub_ids)}
    return [
        Row(h, found[h].name, found[h].name_zh, found[h].tasks, found[h].modalities)
        for h in hub_ids
    ]


def check_case(client: Client, case: Case) -> None:
    """The expected assets are in the first five; with a rule, every one of the five is good."""
    rows = top_rows(client, case)
    shown = [r.hub_id for r in rows]
    assert set(case.top) <= set(shown), (case.query, shown)
    if case.rule is not None:
        assert rows and all(case.relevant(r) for r in rows), (case.query, shown)


def case_id(case: Case) -> str:
    return f"{case.kind}:{case.query}"


@pytest.mark.django_db
def test_a_search_naming_the_other_kind_moves_to_its_list(
    full_catalogue, alice_client: Client
) -> None:
    response = alice_client.get(
        "/marketplace/", {"q": "中文 对话 数据集", "gated": "no", "params_max": "10", "page": "2"}
    )
    assert response.status_code == 302
    target = response["Location"]
    assert target.startswith("/marketplace/datasets/?") and "params_max" not in target
    assert "page" not in target and "gated=no" in target
    page = alice_client.get(target).content.decode()
    assert 'data-hub-id="lccc"' in page and 'data-hub-id="BAAI/COIG"' in page
    # htmx swaps only the results: it is told to load the other list as a page.
    fragment = alice_client.get(
        "/marketplace/", {"q": "chinese chat dataset"}, headers={"HX-Request": "true"}
    )
    assert fragment["HX-Redirect"].startswith("/marketplace/datasets/?q=chinese")
    # The same kind, or none named: no move.
    assert alice_client.get("/marketplace/datasets/", {"q": "中文 数据集"}).status_code == 200
    assert alice_client.get("/marketplace/", {"q": "qwen 模型"}).status_code == 200


# --- issue 21's queries over the shipped catalogue -----------------------------------------------
@pytest.mark.django_db
def test_chinese_chat_datasets_are_all_found(full_catalogue, alice_client: Client) -> None:
    wanted = {
        "lccc",
        "BelleGroup/train_0.5M_CN",
        "BelleGroup/train_1M_CN",
        "shibing624/alpaca-zh",
        "YeungNLP/firefly-train-1.1M",
        "BAAI/COIG",
    }
    for q in ("中文 对话 数据集", "chinese chat dataset", "中文对话数据集"):
        body = alice_client.get(API[DATASET], {"q": q, "limit": 50}).json()
        found = [r["hub_id"] for r in body["results"]]
        assert set(found) == wanted, q
        assert found[0] == "lccc", q  # the conversation corpus itself before instruction data


@pytest.mark.django_db
def test_qwen_chinese_finds_the_qwen_models(full_catalogue, alice_client: Client) -> None:
    body = alice_client.get(API[MODEL], {"q": "qwen 中文", "limit": 500}).json()
    qwen = Asset.objects.filter(kind=MODEL, hub_id__startswith="Qwen/").count()
    assert body["count"] >= qwen > 20
    assert all("qwen" in r["hub_id"].lower() for r in body["results"])


@pytest.mark.django_db
def test_no_size_query_matches_across_a_number_boundary(
    full_catalogue, alice_client: Client
) -> None:
    for size in ("7b", "1.5b", "13b"):
        boundary = re.compile(rf"(?<![\d.])(?<!\dx){re.escape(size)}(?![a-z])", re.I)
        body = alice_client.get(API[MODEL], {"q": size, "limit": 500}).json()
        # The size is in the hub id or the name ("Qwen-Image-Edit Pruning-13B").
        names = [f"{r['hub_id']} {r['name']}" for r in body["results"]]
        assert names and body["count"] == len(names)
        assert all(boundary.search(n) for n in names), [n for n in names if not boundary.search(n)]
    seven = [
        r["hub_id"]
        for r in alice_client.get(API[MODEL], {"q": "7b", "limit": 500}).json()["results"]
    ]
    assert "meta-llama/Llama-2-7b-chat-hf" in seven and "Qwen/Qwen2-7B" in seven


@pytest.mark.django_db
def test_the_browse_page_lists_what_the_api_lists(full_catalogue, alice_client: Client) -> None:
    for case in (
        c for c in CASES if c.query in ("中文 对话 数据集", "qwen 中文", "70亿 对话 模型")
    ):
        response = alice_client.get(
            LIST[case.kind], {"q": case.query}, headers={"HX-Request": "true"}
        )
        page = [html.unescape(h) for h in HUB_ID.findall(response.content.decode())]
        api = alice_client.get(API[case.kind], {"q": case.query, "limit": 24}).json()["results"]
        assert page == [r["hub_id"] for r in api], case.query


def test_the_query_set_is_large_and_covers_both_languages() -> None:
    assert len(CASES) >= 40
    languages = {c.language for c in CASES}
    assert languages == {"zh", "en", "mixed"}
    assert len({(c.kind, c.query) for c in CASES}) == len(CASES)


@pytest.mark.django_db
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_real_queries_put_the_expected_results_first(
    case: Case, full_catalogue, alice_client: Client
) -> None:
    check_case(alice_client, case)
