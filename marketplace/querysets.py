"""Catalogue queries: listing, search (PostgreSQL full-text, plain substring on SQLite), filters."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.postgres.search import SearchQuery, SearchVectorField
from django.db import connection, models
from django.db.models import Case, F, Func, IntegerField, Value, When
from django.db.models.functions import Length, Lower

from marketplace.choices import AssetKind

_TOKEN = re.compile(r"[0-9a-z]+")

# The columns a list page or the list API shows; everything else stays in the database.
LIST_FIELDS = (
    "public_id",
    "kind",
    "hub_id",
    "slug",
    "name",
    "publisher",
    "task",
    "tasks",
    "modalities",
    "params_billion",
    "size_gb",
    "size_estimated",
    "license__public_id",
    "license__key",
    "license__name",
    "license__requires_acceptance",
)

SORTS: dict[str, tuple[Any, ...]] = {
    "name": (Lower("name").asc(), "id"),
    "-name": (Lower("name").desc(), "-id"),
    "size": (F("size_gb").asc(nulls_last=True), Lower("name")),
    "-size": (F("size_gb").desc(nulls_last=True), Lower("name")),
    "params": (F("params_billion").asc(nulls_last=True), Lower("name")),
    "-params": (F("params_billion").desc(nulls_last=True), Lower("name")),
}


class SimpleDocument(Func):
    """``to_tsvector('simple', search_document)``: the expression the GIN index in migration 0002
    is built on, so PostgreSQL answers a search from the index."""

    template = "to_tsvector('simple'::regconfig, %(expressions)s)"
    output_field = SearchVectorField()


def query_tokens(q: str) -> list[str]:
    return _TOKEN.findall(q.lower())[:8]


class AssetQuerySet(models.QuerySet):
    def listed(self) -> AssetQuerySet:
        return self.filter(is_listed=True)

    def of_kind(self, kind: str) -> AssetQuerySet:
        return self.filter(kind=kind)

    def models(self) -> AssetQuerySet:
        return self.listed().of_kind(AssetKind.MODEL)

    def datasets(self) -> AssetQuerySet:
        return self.listed().of_kind(AssetKind.DATASET)

    def for_list(self) -> AssetQuerySet:
        return self.select_related("license").only(*LIST_FIELDS)

    def search(self, q: str) -> AssetQuerySet:
        """Every word of ``q`` must match: a word prefix on PostgreSQL (full-text index), a
        substring of the search document on SQLite."""
        tokens = query_tokens(q)
        if not tokens:
            return self
        if connection.vendor == "postgresql":
            raw = " & ".join(f"{t}:*" for t in tokens)
            return self.alias(document=SimpleDocument("search_document")).filter(
                document=SearchQuery(raw, search_type="raw", config="simple")
            )
        qs = self
        for token in tokens:
            qs = qs.filter(search_document__contains=token)
        return qs

    def with_task(self, task: str) -> AssetQuerySet:
        return self.filter(tasks__contains=f";{task};")

    def with_modality(self, modality: str) -> AssetQuerySet:
        return self.filter(modalities__contains=f",{modality},")

    def by_relevance(self, q: str) -> AssetQuerySet:
        """Best matches first, the same on both databases: a name that starts with the first word,
        a publisher named in the query, then the shortest (most canonical) names:
        "llama 2 7b" puts meta-llama/Llama-2-7b-hf before Nous-Hermes-llama-2-7b fine-tunes."""
        tokens = query_tokens(q)
        if not tokens:
            return self.sorted_by("name")
        score = Case(
            When(name_lower__startswith=tokens[0], then=Value(2)),
            default=Value(0),
            output_field=IntegerField(),
        ) + Case(
            When(publisher_lower__in=tokens, then=Value(1)),
            default=Value(0),
            output_field=IntegerField(),
        )
        return (
            self.alias(name_lower=Lower("name"), publisher_lower=Lower("publisher"))
            .alias(relevance=score, name_length=Length("name"))
            .order_by(F("relevance").desc(), "name_length", "name_lower", "id")
        )

    def sorted_by(self, sort: str) -> AssetQuerySet:
        return self.order_by(*SORTS.get(sort, SORTS["name"]))


class ImageQuerySet(models.QuerySet):
    def listed(self) -> ImageQuerySet:
        return self.filter(is_listed=True)


class ImageVersionQuerySet(models.QuerySet):
    def listed(self) -> ImageVersionQuerySet:
        return self.filter(is_listed=True, image__is_listed=True)
