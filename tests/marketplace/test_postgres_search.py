"""Full-text search on PostgreSQL: the same answers as the SQLite fallback, served by the GIN index."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from marketplace.models import Asset

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_the_search_index_exists_and_the_planner_can_use_it(full_catalogue) -> None:  # noqa: ANN001
    assert connection.vendor == "postgresql"
    qs = Asset.objects.search("llama 7b")
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        sql, params = qs.query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "marketplace_asset_search_gin" in plan, plan


def test_prefix_search_every_word_must_match(full_catalogue, alice_client: Client) -> None:  # noqa: ANN001
    hits = alice_client.get("/api/v1/models/?q=llama 2 7b hf&publisher=meta-llama").json()
    assert [h["hub_id"] for h in hits["results"]] == [
        "meta-llama/Llama-2-7b-hf",
        "meta-llama/Llama-2-7b-chat-hf",
    ]
    # A word prefix is enough on PostgreSQL ("whisp" -> whisper).
    whisper = alice_client.get("/api/v1/models/?q=whisp large v3&publisher=openai").json()
    assert "openai/whisper-large-v3" in [h["hub_id"] for h in whisper["results"]]


def test_filters_and_sorts_behave_as_on_sqlite(full_catalogue, alice_client: Client) -> None:  # noqa: ANN001
    body = alice_client.get("/api/v1/models/?gated=yes&size_max=20&sort=-size&limit=200").json()
    sizes = [r["size_gb"] for r in body["results"]]
    assert sizes == sorted(sizes, reverse=True) and max(sizes) <= 20
    assert all(r["gated"] for r in body["results"])
    names = [
        r["name"].lower()
        for r in alice_client.get("/api/v1/datasets/?q=glue&sort=name").json()["results"]
    ]
    assert names == sorted(names)
