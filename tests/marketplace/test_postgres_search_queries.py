"""Issue 21's search on PostgreSQL: the real queries of search_queries.py give the same first five
as on SQLite (same patterns, same ranking expressions), and the trigram index still serves the
concept and size patterns."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from marketplace.models import Asset
from tests.marketplace.search_queries import CASES, Case
from tests.marketplace.test_search_queries import API, case_id, check_case

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_real_queries_as_on_sqlite(case: Case, full_catalogue, alice_client: Client) -> None:
    assert connection.vendor == "postgresql"
    check_case(alice_client, case)


def test_the_whole_order_is_the_one_sqlite_gives(full_catalogue, alice_client: Client) -> None:
    """Ties are broken the same way (name length, likes, lower-case name, id): a page of 24."""
    body = alice_client.get(API["dataset"], {"q": "中文 对话 数据集", "limit": 24}).json()
    assert [r["hub_id"] for r in body["results"]][:3] == [
        "lccc",
        "BAAI/COIG",
        "shibing624/alpaca-zh",
    ]
    sizes = alice_client.get(API["model"], {"q": "7b", "limit": 500}).json()
    assert "Qwen/Qwen1.5-57B" not in {r["hub_id"] for r in sizes["results"]}


def test_the_trigram_index_serves_sizes_and_the_language_mark(full_catalogue) -> None:
    # A concept is an OR of patterns; one under three characters ("会话") has no trigram, so
    # there the rows are checked one by one (a few thousand short documents), as for "百川".
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for query in ("7b", "qwen 中文", "chinese", "llama 3 8b"):
            sql, params = Asset.objects.search(query).query.sql_with_params()
            cursor.execute(f"EXPLAIN {sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "marketplace_asset_search_trgm" in plan, (query, plan)
