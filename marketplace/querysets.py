"""Catalogue queries: listing, search, filters, orderings.

Search is the same on both databases: every term of the query (``catalogue.query_terms``: ASCII
words and runs of Chinese characters) must be a substring of the asset's ``search_document``,
both lower-cased in Python, so SQLite and PostgreSQL answer the same rows in the same order.
PostgreSQL serves the ``LIKE`` from a pg_trgm GIN index (migration 0005), trigram matching that
works for Chinese as for English; a term under three characters ("百川", "中文") has no trigram,
so there the index narrows nothing and the condition is checked row by row, still correct.
SQLite scans the catalogue's few thousand short documents (a millisecond or two: bench/marketplace.py
prints it); an FTS5 trigram table would need triggers that Django's SQLite table rebuilds drop
silently, leaving a stale index, for no visible gain at this size.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Case, F, IntegerField, Q, Value, When
from django.db.models.functions import Concat, Length, Lower

from marketplace.catalogue import query_terms
from marketplace.choices import AssetKind

# An asset's facts beyond its name, as the catalogue gives them: the loader updates them, the list
# pages, the API and the admin's "Facts" show them.
FACT_FIELDS = ("task", "tasks", "modalities", "params_billion", "size_gb", "size_estimated")

# The columns a list page or the list API shows; everything else stays in the database.
LIST_FIELDS = (
    "public_id",
    "kind",
    "hub_id",
    "slug",
    "name",
    "name_zh",
    "publisher",
    *FACT_FIELDS,
    "likes",
    "license__public_id",
    "license__key",
    "license__name",
    "license__requires_acceptance",
)

SORTS: dict[str, tuple[Any, ...]] = {
    # Most liked first where a source gave likes; the rest after them, by name.
    "popular": (F("likes").desc(nulls_last=True), Lower("name"), "id"),
    "name": (Lower("name").asc(), "id"),
    "-name": (Lower("name").desc(), "-id"),
    "size": (F("size_gb").asc(nulls_last=True), Lower("name")),
    "-size": (F("size_gb").desc(nulls_last=True), Lower("name")),
    "params": (F("params_billion").asc(nulls_last=True), Lower("name")),
    "-params": (F("params_billion").desc(nulls_last=True), Lower("name")),
}
DEFAULT_SORT = "popular"


def query_tokens(q: str) -> list[str]:
    return query_terms(q)


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
        """Every term of ``q`` must occur in the search document ("qwen 中文": both); a query
        with no term at all (punctuation only) filters nothing."""
        terms = query_terms(q)
        if not terms:
            return self
        # ``contains`` is a case-sensitive LIKE on PostgreSQL (the trigram index serves it) and
        # a LIKE on SQLite; both sides are already lower-case, so the two agree.
        condition = Q()
        for term in terms:
            condition &= Q(search_document__contains=term)
        return self.filter(condition)

    def with_task(self, task: str) -> AssetQuerySet:
        return self.filter(tasks__contains=f";{task};")

    def with_modality(self, modality: str) -> AssetQuerySet:
        return self.filter(modalities__contains=f",{modality},")

    def by_relevance(self, q: str) -> AssetQuerySet:
        """Best matches first, the same on both databases: a name (or Chinese name) that starts
        with the first term, then every term in the names themselves (not only in a
        description), then a publisher named in the query; among equals the shortest (most
        canonical) names, then the most liked. "llama 2 7b" puts meta-llama/Llama-2-7b-hf before
        Nous-Hermes-llama-2-7b fine-tunes; "deepseek v2 lite" puts DeepSeek-V2-Lite before
        DeepSeek-V2, whose description mentions the Lite model."""
        terms = query_terms(q)
        if not terms:
            return self.sorted_by(DEFAULT_SORT)
        first = terms[0]
        in_names = Q()
        for term in terms:
            in_names &= Q(names_lower__contains=term)
        score = (
            Case(
                When(
                    Q(name_lower__startswith=first) | Q(name_zh_lower__startswith=first),
                    then=Value(4),
                ),
                default=Value(0),
                output_field=IntegerField(),
            )
            + Case(When(in_names, then=Value(2)), default=Value(0), output_field=IntegerField())
            + Case(
                When(publisher_lower__in=terms, then=Value(1)),
                default=Value(0),
                output_field=IntegerField(),
            )
        )
        return (
            self.alias(
                name_lower=Lower("name"),
                name_zh_lower=Lower("name_zh"),
                names_lower=Lower(Concat("hub_id", Value(" "), "name_zh")),
                publisher_lower=Lower("publisher"),
            )
            .alias(relevance=score, name_length=Length("name"))
            .order_by(
                F("relevance").desc(),
                "name_length",
                F("likes").desc(nulls_last=True),
                "name_lower",
                "id",
            )
        )

    def sorted_by(self, sort: str) -> AssetQuerySet:
        return self.order_by(*SORTS.get(sort, SORTS[DEFAULT_SORT]))


class ImageQuerySet(models.QuerySet):
    def listed(self) -> ImageQuerySet:
        return self.filter(is_listed=True)


class ImageVersionQuerySet(models.QuerySet):
    def listed(self) -> ImageVersionQuerySet:
        return self.filter(is_listed=True, image__is_listed=True)
