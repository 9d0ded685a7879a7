"""Querysets whose SQL is built once per process, for the reads every API request makes (issue 22).

Building a queryset's SQL is most of what a read costs here: 0.5-2 ms of CPU for the token or an
instance with its related rows, against 0.1-0.3 ms to run the SQL and turn the rows into objects.
A ``CompiledQuery`` builds its queryset once with placeholder values, keeps the SQL and where each
value goes, and afterwards runs that SQL with each call's values; the rows become model instances
as the ORM makes them (``select_related`` included, ``prefetch_related`` run as usual)::

    TOKEN = CompiledQuery(
        lambda prefix: ApiToken.objects.select_related("owner").filter(prefix=prefix),
        prefix=ApiToken._meta.get_field("prefix"),
    )
    token = TOKEN.first(prefix="0123456789ab")

    NODES = CompiledQuery(
        lambda ids: InstanceNode.objects.filter(instance__in=ids),
        ids=Many(InstanceNode._meta.get_field("instance")),
    )
    nodes = NODES.all(ids=[1, 2, 3])

Each value names the model field it is compared with, which prepares it for the database as the
ORM would (a UUID on SQLite, a foreign key's target); ``Many(field)`` is a list of them for an
``__in`` lookup (padded to a power of two with its last value, so a few statements serve every
length; an empty list answers no rows without a query). Rules, checked when the SQL is built (the
first call), so a query that breaks one fails at once and everywhere, never silently:

* the queryset's shape must not depend on the values (they are placeholders when it is built);
  what does vary it is passed as ``shape`` positional arguments, and each shape is built once
  (at most ``MAX_SHAPES`` of them; beyond that a call runs through the ORM as always);
* every value must reach the SQL as one parameter, unchanged by its lookup (``exact``, ``in``,
  ``gt``, ``lt``...; not ``contains``, which wraps it in ``%``); a ``Many`` list only in a filter
  that must hold (not in an ``OR`` or an ``exclude``: an empty list answers no rows);
* model querysets only (not ``values()``), on the database they are built for (no router here).
"""

from __future__ import annotations

import datetime
import threading
import uuid
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar, cast

import psycopg
from django.conf import settings
from django.db import connections
from django.db.models import Field, Model, QuerySet
from django.db.models.query import ModelIterable
from django.db.models.sql import Query
from django.db.models.sql.compiler import SQLCompiler
from django.db.models.sql.constants import MULTI

M = TypeVar("M", bound=Model)

MAX_SHAPES = 64

# Placeholder values: unlike any real one, and inside the column types' ranges (Django's integer
# lookups refuse an out-of-range value before it reaches the SQL).
_INT_BASE = -2_100_000_000
# Per integer kind where its range differs: a value outside it is refused by the lookup itself.
_INT_BASES = {
    "PositiveIntegerField": 2_100_000_000,
    "PositiveBigIntegerField": 2_100_000_000,
    "PositiveSmallIntegerField": 32_000,
    "SmallIntegerField": -32_000,
    "SmallAutoField": -32_000,
}
_UUID_BASE = 0xC0DE_0000_0000_0000_0000_0000_0000_0000
_EPOCH = datetime.datetime(1901, 1, 1, tzinfo=datetime.UTC)
_TEXT = {"CharField", "TextField", "SlugField", "EmailField", "URLField"}
_INTEGER = {
    "AutoField",
    "BigAutoField",
    "SmallAutoField",
    "IntegerField",
    "BigIntegerField",
    "SmallIntegerField",
    "PositiveIntegerField",
    "PositiveBigIntegerField",
    "PositiveSmallIntegerField",
}


@dataclass(frozen=True)
class Many:
    """A list of values for ``field``'s ``__in`` lookup."""

    field: Field


def _placeholder(field: Field, index: int) -> object:
    target = cast(Any, field).target_field if field.is_relation else field
    kind = target.get_internal_type()
    if kind in _TEXT:
        return f"\x1ecompiled-{index}\x1e"
    if kind in _INTEGER:
        return _INT_BASES.get(kind, _INT_BASE) + index
    if kind == "UUIDField":
        return uuid.UUID(int=_UUID_BASE + index)
    if kind == "DateTimeField":
        return _EPOCH + datetime.timedelta(microseconds=index + 1)
    raise TypeError(f"CompiledQuery: no placeholder for a {kind} value")


def _prepared(field: Field, value: object, connection: Any) -> object:
    """``value`` as an exact or ``in`` lookup on ``field`` passes it to the database."""
    return field.get_db_prep_value(field.get_prep_value(value), connection, prepared=True)


def _bucket(n: int) -> int:
    """The list length a statement is built for: the next power of two."""
    return 1 << (n - 1).bit_length()


# Where a parameter comes from: a value's name, a list value's (name, index), or fixed.
_Slot = tuple[str, Any]


@dataclass(frozen=True)
class _Statement:
    """One shape's SQL and what its compiler learnt while building it."""

    query: Query
    alias: str  # the database it reads from (no router here: the same for every call)
    sql: str
    slots: tuple[_Slot, ...]
    select: Any
    klass_info: Any
    annotation_col_map: Any
    col_count: int
    has_extra_select: bool
    converters: dict[int, Any]  # the backend's and the fields' per column, as results_iter asks
    prefetch: tuple[Any, ...]


class _StatementQuery(Query):
    """The built query, answering ``get_compiler`` with a compiler that runs the kept SQL."""

    statement: _Statement
    params: tuple[Any, ...]

    def get_compiler(
        self, using: str | None = None, connection: Any = None, elide_empty: bool = True
    ) -> SQLCompiler:
        statement = self.statement
        if connection is None:
            connection = connections[using or statement.alias]
        compiler = connection.ops.compiler(self.compiler)(self, connection, using, elide_empty)
        compiler.select = statement.select
        compiler.klass_info = statement.klass_info
        compiler.annotation_col_map = statement.annotation_col_map
        compiler.col_count = statement.col_count
        compiler.has_extra_select = statement.has_extra_select
        compiler.as_sql = lambda *args, **kwargs: (statement.sql, self.params)
        compiler.get_converters = lambda expressions: statement.converters
        if connection.vendor == "postgresql" and getattr(settings, "DB_PREPARED", False):
            compiler.execute_sql = partial(_execute_prepared, compiler, statement, self.params)
        return compiler


class _PreparedCursor(psycopg.Cursor):  # type: ignore[type-arg]
    """A psycopg cursor binding on the server that prepares every statement it runs."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        kwargs["prepare"] = True
        return super().execute(query, params, **kwargs)


def _execute_prepared(
    compiler: SQLCompiler,
    statement: _Statement,
    params: tuple[Any, ...],
    result_type: str = MULTI,
    chunked_fetch: bool = False,
    chunk_size: int = 0,
) -> Any:
    """``SQLCompiler.execute_sql`` for a kept statement on PostgreSQL: run as a prepared statement.

    The statement's SQL never changes, so the server parses and plans it once per connection
    (psycopg prepares it on its first run there and keeps it, at most ``prepared_max`` of them,
    least recently used dropped first): a quarter of the server's CPU for such a read, measured
    on a four-table join. The cursor is Django's as ``connection.cursor()`` makes it (health
    check, errors translated, queries logged where Django logs them), only binding on the server.
    """
    if result_type != MULTI:
        raise ValueError("CompiledQuery runs its statements for rows only")
    connection = compiler.connection
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        cursor = connection._prepare_cursor(_PreparedCursor(connection.connection))
    with cursor:
        cursor.execute(statement.sql, params)
        rows = cursor.fetchall()
    if statement.has_extra_select:
        rows = [row[0 : statement.col_count] for row in rows]
    return [rows]


class CompiledQuery(Generic[M]):
    """A queryset, built by ``build(*shape, **values)``, whose SQL is made once per shape."""

    def __init__(self, build: Callable[..., QuerySet[M]], **fields: Field | Many) -> None:
        self._build = build
        self._fields = fields
        self._statements: dict[tuple[Hashable, ...], _Statement] = {}
        self._lock = threading.Lock()

    def all(self, *shape: Hashable, **values: Any) -> list[M]:
        """The rows, as ``list(build(*shape, **values))`` gives them."""
        if values.keys() != self._fields.keys():
            raise TypeError(f"CompiledQuery takes the values {sorted(self._fields)}")
        lengths = []
        for name, spec in self._fields.items():
            if isinstance(spec, Many):
                items = list(dict.fromkeys(values[name]))  # the ORM's IN drops repeats too
                if not items:
                    return []
                values[name] = items + items[-1:] * (_bucket(len(items)) - len(items))
                lengths.append(len(values[name]))
        statement = self._statement((*shape, *lengths))
        if statement is None:  # more shapes than are kept: the ORM's own way
            return list(self._build(*shape, **values))
        connection = connections[statement.alias]
        params = tuple(self._param(slot, values, connection) for slot in statement.slots)
        query = _StatementQuery.__new__(_StatementQuery)
        query.__dict__ = statement.query.__dict__.copy()
        query.statement, query.params = statement, params
        queryset: QuerySet[M] = QuerySet(
            model=statement.query.model, query=query, using=statement.alias
        )
        if statement.prefetch:
            cast(Any, queryset)._prefetch_related_lookups = statement.prefetch
        return list(queryset)

    def first(self, *shape: Hashable, **values: Any) -> M | None:
        """The first row or None (the queryset decides the order and any limit)."""
        rows = self.all(*shape, **values)
        return rows[0] if rows else None

    def _field(self, name: str) -> Field:
        spec = self._fields[name]
        return spec.field if isinstance(spec, Many) else spec

    def _param(self, slot: _Slot, values: dict[str, Any], connection: Any) -> object:
        kind, what = slot
        if kind == "fixed":
            return what
        if kind == "value":
            return _prepared(self._field(what), values[what], connection)
        name, index = what
        return _prepared(self._field(name), values[name][index], connection)

    def _statement(self, key: tuple[Hashable, ...]) -> _Statement | None:
        statement = self._statements.get(key)
        if statement is None:
            with self._lock:
                statement = self._statements.get(key)
                if statement is None:
                    if len(self._statements) >= MAX_SHAPES:
                        return None
                    statement = self._compile(key)
                    self._statements[key] = statement
        return statement

    def _compile(self, key: tuple[Hashable, ...]) -> _Statement:
        many = [name for name, spec in self._fields.items() if isinstance(spec, Many)]
        shape = key[: len(key) - len(many)]
        lengths = {name: int(cast(int, n)) for name, n in zip(many, key[len(shape) :], strict=True)}
        placeholders: dict[str, Any] = {}
        wanted: dict[_Slot, object] = {}  # each placeholder's slot and its prepared form
        index = 0
        for name in self._fields:
            if name in lengths:
                placeholders[name] = []
                for i in range(lengths[name]):
                    placeholders[name].append(_placeholder(self._field(name), index))
                    wanted[("item", (name, i))] = placeholders[name][-1]
                    index += 1
            else:
                placeholders[name] = _placeholder(self._field(name), index)
                wanted[("value", name)] = placeholders[name]
                index += 1
        queryset = self._build(*shape, **placeholders)
        if queryset._iterable_class is not ModelIterable:
            raise TypeError("CompiledQuery runs model querysets only (not values()/values_list())")
        connection = connections[queryset.db]
        compiler = queryset.query.get_compiler(using=queryset.db)
        sql, params = compiler.as_sql()  # a .none() raises EmptyResultSet here: refused
        prepared = {
            slot: _prepared(self._field(self._name(slot)), value, connection)
            for slot, value in wanted.items()
        }
        slots: list[_Slot] = []
        for param in params:
            found = next(
                (s for s, p in prepared.items() if type(param) is type(p) and param == p), None
            )
            slots.append(found if found is not None else ("fixed", param))
        missing = [self._name(s) for s in prepared if slots.count(s) != 1]
        if missing:
            raise ValueError(
                f"CompiledQuery: {sorted(set(missing))} do not reach the SQL as parameters, once "
                "and unchanged"
            )
        fields = [s[0] for s in compiler.select[0 : compiler.col_count]]
        return _Statement(
            query=queryset.query,
            alias=queryset.db,
            sql=sql,
            slots=tuple(slots),
            select=compiler.select,
            klass_info=compiler.klass_info,
            annotation_col_map=compiler.annotation_col_map,
            col_count=compiler.col_count,
            has_extra_select=compiler.has_extra_select,
            converters=compiler.get_converters(fields),
            prefetch=tuple(cast(Any, queryset)._prefetch_related_lookups),
        )

    @staticmethod
    def _name(slot: _Slot) -> str:
        kind, what = slot
        return what if kind == "value" else what[0]


def prefetched(obj: Any, name: str, rows: Sequence[Model]) -> None:
    """Give ``obj`` the rows of its reverse foreign key ``name`` as ``prefetch_related(name)``
    would, so ``obj.<name>.all()`` answers them without a query (``filter()`` on it still asks
    the database, scoped to ``obj`` as always)."""
    manager = getattr(obj, name)
    field = manager.field  # the foreign key on the rows' model
    queryset = manager.get_queryset()  # before the cache is filled: scoped to obj, not run
    for row in rows:
        field.set_cached_value(row, obj)
    queryset._result_cache = list(rows)
    queryset._prefetch_done = True
    if not hasattr(obj, "_prefetched_objects_cache"):
        obj._prefetched_objects_cache = {}
    obj._prefetched_objects_cache[field.remote_field.cache_name] = queryset


def prefetched_many(objs: Sequence[Model], name: str, rows: Sequence[Model]) -> None:
    """``prefetched`` for a page: ``rows`` (of every object in ``objs``) handed to their owners."""
    if not objs:
        return
    attname = getattr(objs[0], name).field.attname
    by_owner: dict[Any, list[Model]] = {obj.pk: [] for obj in objs}
    for row in rows:
        by_owner[getattr(row, attname)].append(row)
    for obj in objs:
        prefetched(obj, name, by_owner[obj.pk])
