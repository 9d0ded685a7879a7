"""Search on PostgreSQL: the same answers as on SQLite (English, Chinese and mixed queries), the
substring conditions served by the pg_trgm GIN index."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connection
from django.test import Client

from marketplace.models import Asset
from tests.marketplace.test_chinese_catalogue import SEARCH_CHECKS, check_name

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def _plan(qs) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        sql, params = qs.query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_the_trigram_index_exists_and_the_planner_can_use_it(full_catalogue) -> None:
    assert connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")
        assert cursor.fetchone() == (1,)
    for query in ("llama 7b", "通义千问"):
        plan = _plan(Asset.objects.search(query))
        assert "marketplace_asset_search_trgm" in plan, (query, plan)


@pytest.mark.parametrize("check", SEARCH_CHECKS, ids=check_name)
def test_search_as_on_sqlite(
    check: Callable[[Client], None], full_catalogue, alice_client: Client
) -> None:
    check(alice_client)


def test_prefix_search_every_word_must_match(full_catalogue, alice_client: Client) -> None:
    hits = alice_client.get("/api/v1/models/?q=llama 2 7b hf&publisher=meta-llama").json()
    assert [h["hub_id"] for h in hits["results"]] == [
        "meta-llama/Llama-2-7b-hf",
        "meta-llama/Llama-2-7b-chat-hf",
    ]
    # Part of a word is enough, as on SQLite ("whisp" -> whisper).
    whisper = alice_client.get("/api/v1/models/?q=whisp large v3&publisher=openai").json()
    assert "openai/whisper-large-v3" in [h["hub_id"] for h in whisper["results"]]


def test_filters_and_sorts_behave_as_on_sqlite(full_catalogue, alice_client: Client) -> None:
    body = alice_client.get("/api/v1/models/?gated=yes&size_max=20&sort=-size&limit=200").json()
    sizes = [r["size_gb"] for r in body["results"]]
    assert sizes == sorted(sizes, reverse=True) and max(sizes) <= 20
    assert all(r["gated"] for r in body["results"])
    names = [
        r["name"].lower()
        for r in alice_client.get("/api/v1/datasets/?q=glue&sort=name").json()["results"]
    ]
    assert names == sorted(names)
