"""Catalogue queries: listing, search, filters, orderings.

Search is the same on both databases: ``catalogue.parse_query`` turns the query into a kind (a
kind word such as "数据集" or "model" filters instead of matching text) and clauses; each clause
is one or more patterns, any of which must be a substring of the asset's ``search_document``
(words: "qwen", "千问"; concepts: "对话" is the conversational task, "chat", "dialog*", "对话" …,
"中文" the Chinese mark; sizes and numbers on number boundaries: "7b" is " §s:7b "). The document
and the patterns are lower-case strings built in Python, so SQLite and PostgreSQL answer the same
rows in the same order. PostgreSQL serves the ``LIKE`` from a pg_trgm GIN index (migration 0005),
trigram matching that works for Chinese as for English; a pattern under three characters ("百川")
has no trigram, so there the index narrows nothing and the condition is checked row by row, still
correct. SQLite scans the catalogue's few thousand short documents (a millisecond or two:
bench/marketplace.py prints it); an FTS5 trigram table would need triggers that Django's SQLite
table rebuilds drop silently, leaving a stale index, for no visible gain at this size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import connections, models
from django.db.models import F, IntegerField, Q
from django.db.models.expressions import RawSQL
from django.db.models.functions import Length, Lower

from marketplace.catalogue import SearchQuery, parse_query, query_terms
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


def _any(patterns: tuple[str, ...], field: str) -> Q:
    """``field`` contains one of ``patterns`` (no pattern: nothing matches)."""
    condition = Q() if patterns else Q(pk__in=[])
    for pattern in patterns:
        condition |= Q(**{f"{field}__contains": pattern})
    return condition


def _escape_like(text: str) -> str:
    """As Django's ``contains`` escapes a value on both databases (``prep_for_like_query``)."""
    return text.replace("\\", "\\\\").replace("%", r"\%").replace("_", r"\_")


@dataclass(frozen=True)
class _Sql:
    """A piece of SQL and its parameters, for the relevance expression."""

    sql: str
    params: list[Any] = field(default_factory=list)

    def __add__(self, other: _Sql) -> _Sql:
        return _Sql(f"{self.sql} + {other.sql}", self.params + other.params)

    def when(self, points: int) -> _Sql:
        return _Sql(f"CASE WHEN {self.sql} THEN {points} ELSE 0 END", self.params)

    @staticmethod
    def join(separator: str, parts: list[_Sql]) -> _Sql:
        return _Sql(separator.join(p.sql for p in parts), [x for p in parts for x in p.params])


def _like_any(expression: str, patterns: tuple[str, ...]) -> _Sql:
    """``expression`` contains one of ``patterns`` (none: false), as ``__contains`` writes it."""
    if not patterns:
        return _Sql("(1 = 0)")
    sql = " OR ".join(f"{expression} LIKE %s ESCAPE '\\'" for _ in patterns)
    return _Sql(f"({sql})", [f"%{_escape_like(p)}%" for p in patterns])


class _Columns:
    """Quoted, table-qualified column names (the list query joins the license, which has a
    ``name`` too)."""

    def __init__(self, quote: Any, table: str) -> None:
        self.quote, self.table = quote, quote(table)

    def __call__(self, name: str) -> str:
        return f"{self.table}.{self.quote(name)}"

    def lower_joined(self, *names: str) -> str:
        return "LOWER(" + " || ' ' || ".join(self(n) for n in names) + ")"


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

    def search(self, q: str | SearchQuery) -> AssetQuerySet:
        """Every clause of ``q`` must match ("qwen 中文": a Qwen model that is Chinese); a kind
        word filters by kind; a query with nothing to search for filters nothing."""
        query = parse_query(q) if isinstance(q, str) else q
        qs = self.of_kind(query.kind) if query.kind else self
        if not query.clauses:
            return qs
        # ``contains`` is a case-sensitive LIKE on PostgreSQL (the trigram index serves it) and
        # a LIKE on SQLite; both sides are already lower-case, so the two agree.
        condition = Q()
        for clause in query.clauses:
            condition &= _any(clause.patterns, "search_document")
        return qs.filter(condition)

    def with_task(self, task: str) -> AssetQuerySet:
        return self.filter(tasks__contains=f";{task};")

    def with_modality(self, modality: str) -> AssetQuerySet:
        return self.filter(modalities__contains=f",{modality},")

    def by_relevance(self, q: str | SearchQuery) -> AssetQuerySet:
        """Best matches first, the same on both databases.

        Words as typed: a name (or Chinese name) that starts with the first word scores 4, every
        word, size and number in the names (not only in a description) 2, a publisher named in
        the query 1; "llama 2 7b" puts meta-llama/Llama-2-7b-hf before Nous-Hermes-llama-2-7b
        fine-tunes, "deepseek v2 lite" DeepSeek-V2-Lite before DeepSeek-V2. Each concept: 3 when
        the names or tasks say it (LCCC's "conversation", a "-Chat" model), 2 when they say a
        related thing ("instruct" for chat), plus 1 when the document says the concept itself.
        Among equals the shortest (most canonical) names, then the most liked; a query of
        concepts only ("中文 模型") puts the most liked first, then the shortest names."""
        query = parse_query(q) if isinstance(q, str) else q
        if not query.clauses:
            return self.sorted_by(DEFAULT_SORT)
        words = query.words
        literal = [c for c in query.clauses if c.role != "concept"]
        concepts = [c for c in query.clauses if c.role == "concept"]
        # One SQL expression with its parameters (the same LIKEs Django's lookups write): built
        # as Case/When objects it took longer to compile than to run, the names expression
        # repeated in every condition.
        column = _Columns(connections[self.db].ops.quote_name, self.model._meta.db_table)
        names = column.lower_joined("hub_id", "name", "name_zh", "tasks", "modalities")
        score = _Sql("0")
        if words:
            first = _escape_like(words[0]) + "%"
            score += _Sql(
                f"CASE WHEN LOWER({column('name')}) LIKE %s ESCAPE '\\' OR "
                f"LOWER({column('name_zh')}) LIKE %s ESCAPE '\\' THEN 4 ELSE 0 END",
                [first, first],
            )
            marks = ", ".join(["%s"] * len(words))
            score += _Sql(
                f"CASE WHEN LOWER({column('publisher')}) IN ({marks}) THEN 1 ELSE 0 END",
                list(words),
            )
        if literal:
            every = _Sql.join(" AND ", [_like_any(names, c.hints) for c in literal])
            score += every.when(2)
        document = column("search_document")
        for clause in concepts:
            hints, related = _like_any(names, clause.hints), _like_any(names, clause.related_hints)
            score += _Sql(
                f"CASE WHEN {hints.sql} THEN 3 WHEN {related.sql} THEN 2 ELSE 0 END",
                hints.params + related.params,
            )
            score += _like_any(document, clause.evidence).when(1)
        likes = F("likes").desc(nulls_last=True)
        ties = ("name_length", likes) if words or literal else (likes, "name_length")
        return self.alias(
            # Every value travels as a parameter; the text holds only quoted column names.
            relevance=RawSQL(score.sql, score.params, output_field=IntegerField()),  # noqa: S611
            name_length=Length("name"),
            name_lower=Lower("name"),
        ).order_by(F("relevance").desc(), *ties, "name_lower", "id")

    def sorted_by(self, sort: str) -> AssetQuerySet:
        return self.order_by(*SORTS.get(sort, SORTS[DEFAULT_SORT]))


class ImageQuerySet(models.QuerySet):
    def listed(self) -> ImageQuerySet:
        return self.filter(is_listed=True)


class ImageVersionQuerySet(models.QuerySet):
    def listed(self) -> ImageVersionQuerySet:
        return self.filter(is_listed=True, image__is_listed=True)
